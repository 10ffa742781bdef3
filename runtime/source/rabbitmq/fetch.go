package rabbitmq

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// Fetch waits up to maxWait for a first delivery, then takes what else has
// already arrived, up to maxN. When that is less than maxN and the queue
// holds messages the broker has not delivered yet (its ready count, one
// passive queue.declare), it keeps taking deliveries as they arrive, up to
// maxN, waiting at most fillGap for each next one and max(maxWait,
// fillGap) for the fill, and never past the prefetch window (nothing more
// arrives until the deliveries held are acknowledged). With nothing ready
// it returns at once, so a lone message at low load is not held. The
// worst case, a slow ready count under a backlog, holds a fetch for about
// three times maxWait: the first delivery, the ready count's round trip
// (bounded by max(maxWait, fillGap)) and the fill.
//
// Why: the broker pushes deliveries one by one as fast as its queue
// process goes, so a fetch that took only what had arrived when the first
// delivery came got a few messages under a backlog too (measured, 2 x 500
// on a classic queue of 100,000: 13 messages per transaction), and the
// replicas' and PostgreSQL's cost per transaction took the CPU the broker
// needed. Fetch is not safe for concurrent use (the loop has one fetcher).
func (s *Source) Fetch(ctx context.Context, maxN int, maxWait time.Duration) ([]source.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sess, err := s.ensureSession(ctx)
	if err != nil || maxN <= 0 {
		return nil, err
	}
	first, ok, err := s.waitFirst(ctx, sess, maxWait)
	if err != nil || !ok {
		return nil, err
	}
	ds, open := drain(sess.buf, []amqp.Delivery{first}, maxN)
	if open && len(ds) < maxN {
		ds, open = s.fill(ctx, sess, ds, maxN, maxWait)
	}
	if !open || sess.ch.IsClosed() {
		// These deliveries cannot be acknowledged; the broker requeues them.
		s.drop(sess, "channel closed")
		return nil, fmt.Errorf("while fetching from queue %s: channel closed", s.queue)
	}
	return s.messages(sess, ds), nil
}

// fillGap bounds the wait for each next delivery of a backlog: a batch
// fills from it, but a broker that has stopped delivering (another
// consumer took the rest, or it is busy) is not waited for longer.
const fillGap = 50 * time.Millisecond

// readyZeroTTL is how long a ready count of zero is believed: a fetch
// within it does not ask again. It bounds the queries at low load, where
// every fetch is short and the answer is always zero (the broker delivers
// each message as it comes while the prefetch windows have room).
const readyZeroTTL = 10 * time.Millisecond

// fill takes more deliveries while the queue holds a backlog (see Fetch);
// open is false when buf was closed.
func (s *Source) fill(ctx context.Context, sess *session, ds []amqp.Delivery, maxN int, fillFor time.Duration) (_ []amqp.Delivery, open bool) {
	backlog := s.backlog(ctx, sess, fillFor)
	if backlog == 0 {
		return ds, true
	}
	// The ready count leaves out what the broker has sent and this
	// channel not yet received, so it only says that more is coming:
	// the batch fills to maxN, bounded by the window and the waits.
	want := maxN
	until := s.opts.fillClock.NewTimer(max(fillFor, fillGap))
	defer until.Stop()
	gap := s.opts.fillClock.NewTimer(fillGap)
	defer gap.Stop()
	for {
		if ds, open = drain(sess.buf, ds, want); !open {
			return ds, false
		}
		if len(ds) >= want || s.windowFull(sess, len(ds)) {
			return ds, true
		}
		gap.Reset(fillGap)
		select {
		case d, ok := <-sess.buf:
			if !ok {
				return ds, false
			}
			ds = append(ds, d)
		case <-gap.C():
			return ds, true
		case <-until.C():
			return ds, true
		case <-ctx.Done():
			return ds, true // the caller sees ctx end and leaves them unacked
		}
	}
}

// windowFull reports whether the deliveries this channel holds
// unacknowledged (fetched, deferred and in hand) fill the prefetch
// window: the broker sends nothing more until some are acknowledged.
func (s *Source) windowFull(sess *session, inHand int) bool {
	if s.cfg.Prefetch <= 0 {
		return false // no window
	}
	s.mu.Lock()
	held := len(sess.pending) + len(sess.deferred)
	s.mu.Unlock()
	return held+inHand >= s.cfg.Prefetch
}

// backlog is the queue's ready count (messages not yet delivered to any
// consumer) from a passive queue.declare, 0 when it is not known: a query
// that fails, or takes longer than wait, counts as no backlog. (It fails
// only when the queue is gone, which closes the channel; the caller sees
// that.)
func (s *Source) backlog(ctx context.Context, sess *session, wait time.Duration) int {
	now := time.Now()
	if now.Before(s.readyZeroUntil) || !s.asking.CompareAndSwap(false, true) {
		return 0
	}
	ready := make(chan int, 1)
	go func() {
		defer s.asking.Store(false)
		sess.rpc.Lock()
		q, err := sess.ch.QueueDeclarePassive(s.queue, true, false, false, false, nil)
		sess.rpc.Unlock()
		if err != nil {
			s.log.V(1).Info("could not read the queue's ready count; taking what has arrived", "error", err.Error())
			ready <- 0
			return
		}
		ready <- q.Messages
	}()
	t := s.opts.fillClock.NewTimer(max(wait, fillGap))
	defer t.Stop()
	n := 0
	select {
	case n = <-ready:
	case <-t.C():
	case <-ctx.Done():
	}
	if n == 0 {
		s.readyZeroUntil = now.Add(readyZeroTTL)
	}
	return n
}

// drain appends what has already arrived, up to maxN deliveries; open is
// false when buf was closed.
func drain(buf <-chan amqp.Delivery, ds []amqp.Delivery, maxN int) (_ []amqp.Delivery, open bool) {
	for len(ds) < maxN {
		select {
		case d, ok := <-buf:
			if !ok {
				return ds, false
			}
			ds = append(ds, d)
		default:
			return ds, true
		}
	}
	return ds, true
}

func (s *Source) waitFirst(ctx context.Context, sess *session, maxWait time.Duration) (amqp.Delivery, bool, error) {
	t := time.NewTimer(maxWait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return amqp.Delivery{}, false, ctx.Err()
	case <-t.C:
		return amqp.Delivery{}, false, nil
	case d, open := <-sess.buf:
		if !open {
			s.drop(sess, "channel closed")
			return d, false, fmt.Errorf("while fetching from queue %s: channel closed", s.queue)
		}
		return d, true, nil
	}
}

func (s *Source) messages(sess *session, ds []amqp.Delivery) []source.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.clock.Now()
	msgs := make([]source.Message, len(ds))
	for i, d := range ds {
		sess.pending[d.DeliveryTag] = struct{}{}
		msgs[i] = convert(d, now)
		msgs[i].Ref = ref{gen: sess.gen, tag: d.DeliveryTag}
	}
	return msgs
}
