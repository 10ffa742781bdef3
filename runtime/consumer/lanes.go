package consumer

import (
	"context"
	"sync"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/pause"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// holdPoll is how often a lane or the fetcher waiting out a sink hold looks
// whether it ended.
const holdPoll = 20 * time.Millisecond

// laneBatch is one lane's share of a fetched batch: committed in its own
// transaction and acknowledged once that transaction committed.
type laneBatch struct {
	// msgs is every delivery to acknowledge after the commit: the records,
	// their in-batch duplicates and the dead letters of this lane.
	msgs    []source.Message
	recs    []*extract.Message
	dls     []deadLetter
	dups    int
	fetched time.Time
	// parts is how many dispatched batches this one is (mergeQueued joins
	// them); dones are closed once it settled (dispatchWhole).
	parts int32
	dones []chan struct{}
}

// pipeline runs the overlapped loop: one goroutine fetches while up to
// delivery.inFlight lanes commit, each on its own connection. A message goes
// to the lane of its entity key's hash (else its id's), so two transactions
// in flight never touch one key, and each lane takes its batches in fetch
// order, which keeps the sequence order per key. A lane queues one batch
// ahead; the fetcher blocks when the queue of a lane it must feed is full.
//
// A panic in a lane (a bug, or a test's crash hook) is a crash: from then on
// nothing is acknowledged, nothing fetched, no batch started, and Run panics
// with the same value in its own goroutine once the lanes stopped.
func (c *Consumer) pipeline(ctx context.Context) {
	work := context.WithoutCancel(ctx) // a started transaction outlives a stop request
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	c.abort = crash{stop: stop}
	lanes := make([]chan laneBatch, c.inFlight())
	var wg sync.WaitGroup
	for i := range lanes {
		lanes[i] = make(chan laneBatch, 1)
		wg.Go(func() { c.runLane(work, ctx, lanes[i]) })
	}
	c.fetchLoop(ctx, lanes)
	for _, l := range lanes {
		close(l)
	}
	wg.Wait()
	if p := c.crashed.Load(); p != nil {
		panic(p.value)
	}
}

// crash ends the pipeline after a lane panicked.
type crash struct{ stop context.CancelFunc }

// panicked is the first panic value of a lane.
type panicked struct{ value any }

// dead reports whether a lane crashed: nothing may be acknowledged any more.
func (c *Consumer) dead() bool { return c.crashed.Load() != nil }

func (c *Consumer) inFlight() int { return max(c.delivery.InFlight, 1) }

// fetchLoop fetches until ctx ends and hands every batch to the lanes. It
// does not fetch while the loop holds on a misconfigured sink.
func (c *Consumer) fetchLoop(ctx context.Context, lanes []chan laneBatch) {
	failures := 0
	for ctx.Err() == nil {
		if !c.waitUnheld(ctx) {
			return
		}
		// One fetch feeds every lane a transaction of up to batchSize.
		msgs, err := c.src.Fetch(ctx, c.delivery.BatchSize*len(lanes), c.delivery.MaxWait.Duration)
		if ctx.Err() != nil {
			// A fetch cut short by the stop may still have returned
			// messages; they were not processed, so they stay unacked.
			return
		}
		if err != nil {
			failures++
			c.log.Error(err, "Fetch failed; backing off", "failures", failures)
			if !pause.For(ctx, c.backoff(failures)) {
				return
			}
			continue
		}
		failures = 0
		c.fetchReady.Store(true)
		if len(msgs) == 0 {
			continue
		}
		if !c.awaitWhole(ctx) {
			return // the fetch stays unacked
		}
		if len(lanes) > 1 && len(msgs) <= c.wholeFetchMax() && c.inFlightBatches.Load() == 0 {
			if !c.dispatchWhole(ctx, lanes[0], msgs) {
				return
			}
			continue
		}
		if !c.dispatch(ctx, lanes, c.split(msgs, len(lanes))) {
			return // the rest of the fetch stays unacked
		}
	}
}

// dispatch hands every lane its batches in order, taking the lanes in turn
// so one busy lane does not starve the others. It reports false when ctx
// ended first.
func (c *Consumer) dispatch(ctx context.Context, lanes []chan laneBatch, perLane [][]laneBatch) bool {
	for k := 0; ; k++ {
		sent := false
		for i, batches := range perLane {
			if k >= len(batches) {
				continue
			}
			sent = true
			c.inFlightBatches.Add(1)
			select {
			case lanes[i] <- batches[k]:
			case <-ctx.Done():
				c.inFlightBatches.Add(-1)
				return false
			}
		}
		if !sent {
			return true
		}
	}
}

// dispatchWhole hands a small fetch (wholeFetchMax), taken while no lane
// has a batch in flight, whole to one lane: at low load a fetch of a
// few messages would otherwise be split into a transaction per lane, each
// paying a commit for a message or two, and the machine's CPU went to
// commits (10% load on two replicas: 5 messages per transaction). No other
// lane can then hold a key of it, and the next fetch is dispatched only
// once it settled (awaitWhole), so two transactions in flight still never
// touch one key and each key keeps its fetch order. The wait also lets the
// next fetch gather what arrives meanwhile into one transaction.
func (c *Consumer) dispatchWhole(ctx context.Context, lane chan<- laneBatch, msgs []source.Message) bool {
	// One batch, as the fetch is at most wholeFetchMax; were it more, they
	// would go in order to the same lane, which keeps the same promises.
	batches := c.split(msgs, 1)[0]
	done := make(chan struct{})
	batches[len(batches)-1].dones = []chan struct{}{done}
	c.whole = done
	for _, lb := range batches {
		c.inFlightBatches.Add(1)
		select {
		case lane <- lb:
		case <-ctx.Done():
			c.inFlightBatches.Add(-1)
			return false
		}
	}
	return true
}

// wholeFetchMax is the largest fetch dispatchWhole takes: a sixteenth of a
// batch (31 messages of 500). A larger fetch is split over the lanes as
// before: its transactions are long enough that committing them side by
// side beats saving a commit (at half the maximum load, committing every
// fetch of about 100 messages whole raised p99 from 158 to 269 ms).
func (c *Consumer) wholeFetchMax() int { return max(c.delivery.BatchSize/16, 1) }

// awaitWhole waits until the fetch last dispatched whole settled. It
// reports false when ctx ended first.
func (c *Consumer) awaitWhole(ctx context.Context) bool {
	if c.whole == nil {
		return true
	}
	select {
	case <-c.whole:
		c.whole = nil
		return true
	case <-ctx.Done():
		return false
	}
}

// settled records that lb was committed and acknowledged, or dropped after
// a stop.
func (c *Consumer) settled(lb laneBatch) {
	c.inFlightBatches.Add(-lb.parts)
	for _, d := range lb.dones {
		close(d)
	}
}

// runLane settles its batches in order. After a stop request it starts no
// new batch: those stay unacknowledged and the broker redelivers them.
func (c *Consumer) runLane(work, stop context.Context, in <-chan laneBatch) {
	defer func() {
		if p := recover(); p != nil {
			c.crashed.CompareAndSwap(nil, &panicked{value: p})
			c.abort.stop()
			for range in { // drain, so the fetcher never blocks on this lane
			}
		}
	}()
	stopped := false
	for lb := range in {
		if stopped || stop.Err() != nil || c.dead() || !c.waitUnheld(stop) {
			c.settled(lb)
			continue
		}
		lb = c.mergeQueued(lb, in)
		if err := c.process(work, stop, lb); err != nil {
			stopped = true
			c.log.Info("Stopped with a batch not committed; the broker will redeliver it", "messages", len(lb.msgs))
		}
		c.settled(lb)
	}
}

// mergeQueued joins the lane's next queued batch into this one while the
// result stays within batchSize: when fetching outpaces committing, a lane
// commits one transaction of a whole batch instead of two halves.
func (c *Consumer) mergeQueued(lb laneBatch, in <-chan laneBatch) laneBatch {
	for len(lb.msgs) < c.delivery.BatchSize {
		select {
		case next, ok := <-in:
			if !ok {
				return lb
			}
			lb = lb.join(next)
		default:
			return lb
		}
	}
	return lb
}

// join appends b (fetched later) to lb. An id already in lb is a duplicate
// of it, acknowledged with the merged batch.
func (lb laneBatch) join(b laneBatch) laneBatch {
	seen := make(map[string]struct{}, len(lb.recs))
	for _, m := range lb.recs {
		seen[m.ID] = struct{}{}
	}
	for _, m := range b.recs {
		if _, dup := seen[m.ID]; dup {
			lb.dups++
			continue
		}
		seen[m.ID] = struct{}{}
		lb.recs = append(lb.recs, m)
	}
	lb.msgs = append(lb.msgs, b.msgs...)
	lb.dls = append(lb.dls, b.dls...)
	lb.dups += b.dups
	lb.parts += b.parts
	lb.dones = append(lb.dones, b.dones...)
	return lb
}

// waitUnheld waits while the loop holds on a misconfigured sink: no lane
// starts a batch and nothing is fetched until the lanes that hold commit. It
// reports false when stop ended first.
func (c *Consumer) waitUnheld(stop context.Context) bool {
	for c.held.Load() != nil {
		if !pause.For(stop, holdPoll) {
			return false
		}
	}
	return stop.Err() == nil
}

// split extracts every message's id (and entity key) once and assigns it to
// a lane, each lane's messages cut into batches of at most batchSize, in
// fetch order. Messages without a usable id become dead letters (on the
// lane of their native id). An id repeated within one batch is a duplicate,
// acknowledged with it; one repeated in a later batch is claimed again
// there, so the inbox decides (duplicate, or a conflicting payload).
func (c *Consumer) split(msgs []source.Message, n int) [][]laneBatch {
	now := time.Now()
	out := make([][]laneBatch, n)
	limit := max(c.delivery.BatchSize, 1)
	// current is lane i's open batch; a full one is closed first.
	current := func(i int) *laneBatch {
		if len(out[i]) == 0 || len(out[i][len(out[i])-1].msgs) >= limit {
			out[i] = append(out[i], laneBatch{fetched: now, parts: 1})
		}
		return &out[i][len(out[i])-1]
	}
	type at struct{ lane, batch int }
	seen := make(map[string]at, len(msgs))
	slab := extract.NewMessages(msgs) // two allocations for the fetch
	for i, sm := range msgs {
		m := &slab[i]
		id, err := c.id.Text(m)
		if err == nil {
			err = checkID(id)
		}
		if err != nil {
			lb := current(laneOf(sm.NativeID, n))
			lb.dls = append(lb.dls, newDeadLetter(m, "message id: "+err.Error(), idErrorClass(err), 1))
			lb.msgs = append(lb.msgs, sm)
			continue
		}
		m.ID = id
		lane := laneOf(c.laneKey(m), n)
		if first, ok := seen[id]; ok && len(out[first.lane])-1 == first.batch {
			if lb := &out[first.lane][first.batch]; len(lb.msgs) < limit {
				lb.dups++
				lb.msgs = append(lb.msgs, sm)
				continue
			}
		}
		lb := current(lane)
		seen[id] = at{lane, len(out[lane]) - 1}
		lb.recs = append(lb.recs, m)
		lb.msgs = append(lb.msgs, sm)
	}
	return out
}

// laneKey is the entity key when one is configured and present, else the id.
func (c *Consumer) laneKey(m *extract.Message) string {
	if c.key != nil {
		if k, err := c.key.Text(m); err == nil {
			return k
		}
	}
	return m.ID
}

// laneOf is FNV-1a of s modulo n.
func laneOf(s string, n int) int {
	if n <= 1 {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}
