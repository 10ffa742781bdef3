package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// event is the payload of every message. eventId is the dedup id (the
// runtime reads it with message.id.jsonPath $.eventId); key and version
// drive the sequence gate of the upsert consumer.
type event struct {
	EventID string `json:"eventId"`
	Key     string `json:"key"`
	Version int    `json:"version"`
	Status  string `json:"status"`
	N       int    `json:"n"`
}

// workload is what the publisher sends: the unique events, and the order
// of publication as indexes into them (a duplicate repeats an index).
type workload struct {
	events []event
	order  []int
}

// shuffleBlock is how many keys have their versions shuffled together, so
// the versions of one key are published close in time (replicas race on
// the same key) yet out of order.
const shuffleBlock = 50

// laterSpread bounds how far after its original a postponed copy lands.
const laterSpread = 3000

// newWorkload builds total messages of which dupShare are re-sent copies
// of earlier events (same eventId and body, a new broker message): half
// right after their original, so concurrent replicas race on them, half at
// a random later point, after the original was most likely applied.
func newWorkload(total, versions int, dupShare float64, rng *rand.Rand) workload {
	unique := total - int(float64(total)*dupShare)
	keys := (unique + versions - 1) / versions
	var w workload
	for block := 0; block < keys; block += shuffleBlock {
		start := len(w.events)
		for k := block; k < min(block+shuffleBlock, keys); k++ {
			for v := 1; v <= versions && len(w.events) < unique; v++ {
				w.events = append(w.events, event{
					EventID: fmt.Sprintf("k%06d-v%03d", k, v), Key: fmt.Sprintf("k%06d", k),
					Version: v, Status: fmt.Sprintf("s%03d", v), N: len(w.events),
				})
			}
		}
		part := w.events[start:]
		rng.Shuffle(len(part), func(i, j int) { part[i], part[j] = part[j], part[i] })
	}
	w.order = duplicateOrder(len(w.events), total-len(w.events), rng)
	return w
}

func duplicateOrder(unique, dups int, rng *rand.Rand) []int {
	type slot struct {
		idx int
		pos float64
	}
	slots := make([]slot, 0, unique+dups)
	for i := range unique {
		slots = append(slots, slot{i, float64(i)})
	}
	for range dups {
		j := rng.IntN(unique)
		pos := float64(j) + 0.5
		if rng.IntN(2) == 0 {
			pos = float64(j+1+rng.IntN(laterSpread)) + 0.25
		}
		slots = append(slots, slot{j, pos})
	}
	sort.SliceStable(slots, func(a, b int) bool { return slots[a].pos < slots[b].pos })
	order := make([]int, len(slots))
	for i, s := range slots {
		order[i] = s.idx
	}
	return order
}

// publisher sends a workload at a steady pace and records what JetStream
// acknowledged: the checker's list of what was published.
type publisher struct {
	js      jetstream.JetStream
	subject string
	w       workload
	bodies  [][]byte
	copies  []int // per event: publications acknowledged by JetStream
	sent    atomic.Int64
	dupAcks int // PubAcks flagged Duplicate: must stay 0
	// reserve: the last messages of the order, held back after the timed
	// bursts and published reserveChunk at a time on release (see
	// driver.chaos), so a replica armed with the failpoint finds work: the
	// runtime drains a burst before a restarted replica is up.
	reserve int
	held    chan struct{} // closed when the timed bursts are out
	release chan bool     // true: the rest of the reserve; false: one chunk
	done    chan struct{}
	err     error
}

// reserveChunk is one release of the reserve: a few batches for every
// replica, so the armed one gets some.
const reserveChunk = 200

func newPublisher(s *stream, w workload, reserve int) *publisher {
	p := &publisher{js: s.js, subject: s.subject, w: w, bodies: make([][]byte, len(w.events)),
		copies: make([]int, len(w.events)), reserve: min(reserve, len(w.order)),
		held: make(chan struct{}), release: make(chan bool), done: make(chan struct{})}
	for i, e := range w.events {
		p.bodies[i], _ = json.Marshal(e) // a flat struct always marshals
	}
	return p
}

// run publishes the workload but its reserve in bursts, one every
// burstEvery over about d, then closes p.held and publishes the reserve as
// the driver releases it; then it closes p.done. Each burst is sent as fast
// as JetStream takes it, so the replicas have a backlog to work through: a
// fault then lands in the middle of a batch rather than in an idle wait.
func (p *publisher) run(ctx context.Context, d, burstEvery time.Duration) {
	defer close(p.done)
	timed := p.w.order[:len(p.w.order)-p.reserve]
	bursts := max(1, int(d/burstEvery))
	chunk := max(1, (len(timed)+bursts-1)/bursts)
	t := time.NewTicker(burstEvery)
	defer t.Stop()
	for start := 0; start < len(timed); start += chunk {
		if err := p.publishChunk(ctx, timed[start:min(start+chunk, len(timed))]); err != nil {
			p.err = err
			return
		}
		if start+chunk >= len(timed) {
			break
		}
		select {
		case <-ctx.Done():
			p.err = ctx.Err()
			return
		case <-t.C:
		}
	}
	close(p.held)
	rest := p.w.order[len(timed):]
	for len(rest) > 0 {
		select {
		case <-ctx.Done():
			p.err = ctx.Err()
			return
		case all := <-p.release:
			n := min(len(rest), reserveChunk)
			if all {
				n = len(rest)
			}
			if err := p.publishChunk(ctx, rest[:n]); err != nil {
				p.err = err
				return
			}
			rest = rest[n:]
		}
	}
}

func (p *publisher) publishChunk(ctx context.Context, idxs []int) error {
	futures := make([]jetstream.PubAckFuture, len(idxs))
	for i, ix := range idxs {
		// No Nats-Msg-Id: see newStream.
		futures[i], _ = p.js.PublishAsync(p.subject, p.bodies[ix])
	}
	for i, f := range futures {
		ack, err := awaitAck(f)
		if err != nil {
			// A producer retry: at worst one more duplicate in the stream.
			if ack, err = p.js.Publish(ctx, p.subject, p.bodies[idxs[i]]); err != nil {
				return fmt.Errorf("publishing %s: %w", p.w.events[idxs[i]].EventID, err)
			}
		}
		if ack.Duplicate {
			p.dupAcks++
		}
		p.copies[idxs[i]]++
		p.sent.Add(1)
	}
	return nil
}

var errNoFuture = errors.New("the asynchronous publish was refused")

func awaitAck(f jetstream.PubAckFuture) (*jetstream.PubAck, error) {
	if f == nil {
		return nil, errNoFuture
	}
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		return nil, err
	case <-time.After(30 * time.Second):
		return nil, errors.New("no PubAck within 30s")
	}
}

// published returns the events acknowledged at least once.
func (p *publisher) published() []event {
	out := make([]event, 0, len(p.w.events))
	for i, e := range p.w.events {
		if p.copies[i] > 0 {
			out = append(out, e)
		}
	}
	return out
}
