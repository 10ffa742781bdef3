package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// ackFailureHold is how long a batch whose ack failed still counts as
// unacknowledged in the progress record: the broker hands it back after its
// lease and it is acknowledged then as a duplicate, by this replica or
// another.
const ackFailureHold = 10 * time.Minute

// progress is what this replica's heartbeat reports (retention.Hold): the
// claim transactions begun and not yet acknowledged, the last commit and
// the highest broker positions claimed. Lanes touch it once per batch.
type progress struct {
	replica string
	// positionOf parses a message's broker position (nil: the broker has
	// no positions worth reporting).
	positionOf func(nativeID string) (string, int64, bool)

	mu         sync.Mutex
	next       uint64
	unacked    map[uint64]time.Time // by token: when the batch's claim began
	expires    map[uint64]time.Time // tokens of failed acks: when they stop counting
	lastCommit time.Time
	positions  map[string]int64
}

func newProgress(replica string, src config.Source) *progress {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	p := &progress{
		// A restarted container keeps its pod name: the suffix keeps the
		// record its predecessor left (and may still need) apart.
		replica: replica + "-" + hex.EncodeToString(suffix),
		unacked: map[uint64]time.Time{}, expires: map[uint64]time.Time{},
		positions: map[string]int64{},
	}
	switch {
	case src.NATSJetStream != nil:
		p.positionOf = splitPosition(':') // "<stream>:<stream seq>"
	case src.Kafka != nil:
		p.positionOf = splitPosition('/') // "<topic>/<partition>/<offset>"
	}
	return p
}

// splitPosition parses "<key><sep><n>".
func splitPosition(sep byte) func(string) (string, int64, bool) {
	return func(id string) (string, int64, bool) {
		i := strings.LastIndexByte(id, sep)
		if i <= 0 {
			return "", 0, false
		}
		n, err := strconv.ParseInt(id[i+1:], 10, 64)
		return id[:i], n, err == nil
	}
}

// begin is called before a batch's claim transaction begins.
func (p *progress) begin() uint64 {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	p.unacked[p.next] = now
	return p.next
}

// committed notes a committed batch.
func (p *progress) committed(msgs []source.Message) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastCommit = now
	if p.positionOf == nil {
		return
	}
	for i := range msgs {
		if k, n, ok := p.positionOf(msgs[i].NativeID); ok && n > p.positions[k] {
			p.positions[k] = n
		}
	}
}

// acked ends a batch's token: its claims are acknowledged, or nothing of it
// was claimed. A failed ack keeps counting for ackFailureHold.
func (p *progress) acked(token uint64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ok {
		delete(p.unacked, token)
		return
	}
	p.expires[token] = time.Now().Add(ackFailureHold)
}

// heartbeat is the record to write now; stopping marks a graceful stop,
// which it is only when nothing committed is left unacknowledged.
func (p *progress) heartbeat(stopping bool) inbox.Heartbeat {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	hb := inbox.Heartbeat{Replica: p.replica, Positions: make(map[string]int64, len(p.positions))}
	for k, v := range p.positions {
		hb.Positions[k] = v
	}
	if !p.lastCommit.IsZero() {
		age := now.Sub(p.lastCommit)
		hb.LastCommitAge = &age
	}
	var oldest time.Time
	for tok, began := range p.unacked {
		if exp, ok := p.expires[tok]; ok && now.After(exp) {
			delete(p.unacked, tok)
			delete(p.expires, tok)
			continue
		}
		if oldest.IsZero() || began.Before(oldest) {
			oldest = began
		}
	}
	if !oldest.IsZero() {
		age := now.Sub(oldest)
		hb.UnackedAge = &age
	}
	hb.Stopped = stopping && hb.UnackedAge == nil
	return hb
}

// registerProgress writes this replica's first progress record, retrying
// until the database takes it: a replica that could crash between COMMIT
// and ack before its first heartbeat must be on record before it fetches.
func (c *Consumer) registerProgress(ctx context.Context) bool {
	for n := 1; ; n++ {
		err := c.store.WriteHeartbeat(ctx, c.progress.heartbeat(false))
		if err == nil {
			return true
		}
		c.log.Error(err, "Cannot record this replica's progress yet; not fetching until it is recorded", "attempt", n)
		if !c.sleep(ctx, backoff(n, c.delivery.BackoffInitial.Duration, c.delivery.BackoffMax.Duration)) {
			return false
		}
	}
}

// reportProgress writes the progress record every retention.ProgressInterval
// until ctx ends.
func (c *Consumer) reportProgress(ctx context.Context) {
	t := time.NewTicker(retention.ProgressInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.store.WriteHeartbeat(ctx, c.progress.heartbeat(false)); err != nil && ctx.Err() == nil {
			c.log.Error(err, "Could not record this replica's progress; pruning holds back from its last record")
		}
	}
}

// FinishProgress writes the last progress record after the loop and the
// source stopped (the source's Close flushes the last acks): a graceful stop
// when every committed claim was acknowledged and the source closed cleanly,
// so it holds nothing back.
func (c *Consumer) FinishProgress(ctx context.Context, closedCleanly bool) error {
	hb := c.progress.heartbeat(closedCleanly)
	if err := c.store.WriteHeartbeat(ctx, hb); err != nil {
		return err
	}
	if !hb.Stopped {
		c.log.Info("Stopped with claims committed but not acknowledged; pruning holds back from this replica's record until the broker settles them",
			"progressReplica", hb.Replica)
	}
	return nil
}
