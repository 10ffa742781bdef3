package jetstream

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// firstWait is how the wait for a batch's first message ended.
type firstWait int

const (
	firstArrived   firstWait = iota // a message, or the batch ended
	firstTimedOut                   // the caller's wait fired
	firstExpired                    // the waiting request expired and was given up
	firstCancelled                  // ctx ended
)

// first waits for r's first message, at most until wait fires or the
// request is past its expiry (expired).
func (s *Source) first(ctx context.Context, r *pullRequest, wait, expired <-chan time.Time) (jetstream.Msg, bool, firstWait) {
	select {
	case <-ctx.Done():
		return nil, false, firstCancelled
	case <-wait:
		return nil, false, firstTimedOut
	case m, ok := <-r.batch.Messages():
		return m, ok, firstArrived
	case <-expired:
		if m, ok := ready(r.batch); m != nil || !ok {
			return m, ok, firstArrived
		}
		s.retire(r)
		return nil, false, firstExpired
	}
}

// take waits (until wait fires) for r's first message, then takes the
// messages r has delivered, up to maxN, and, while the last one says more
// are pending on the server, waits up to FillGap for each next one. It
// leaves r ended (complete, its batch over, an error), late (given up past
// its expiry) or open (it has more to give); timedOut says wait fired
// before any message.
func (s *Source) take(ctx context.Context, r *pullRequest, maxN int, wait <-chan time.Time, fillFor time.Duration) (msgs []source.Message, timedOut bool, err error) {
	f := filling{gapFor: s.timing.FillGap}
	defer f.stop()
	expired, stopExpiry := r.expiry()
	defer stopExpiry()
	for len(msgs) < maxN {
		if r.complete() {
			// Every message the request asked for was taken: it is
			// complete (nats.go closes it right after the last).
			s.end(r)
			return msgs, false, nil
		}
		var m jetstream.Msg
		var ok bool
		if len(msgs) == 0 {
			var w firstWait
			switch m, ok, w = s.first(ctx, r, wait, expired); w {
			case firstCancelled:
				// Whatever was delivered is redelivered after AckWait.
				s.end(r)
				return nil, false, ctx.Err()
			case firstTimedOut:
				s.keepOpen(r) // the next Fetch waits on it again
				return nil, true, nil
			case firstExpired:
				return nil, false, nil // late: the next Fetch sends another
			case firstArrived:
			}
		} else {
			var stop bool
			if m, ok, stop = f.next(r.batch, len(msgs)); stop {
				s.keepOpen(r)
				return msgs, false, nil
			}
		}
		if !ok {
			s.end(r)
			msgs, err := s.finish(msgs, r.batch.Error())
			return msgs, false, err
		}
		msg, md, err := convertMeta(m)
		if err != nil {
			s.end(r)
			return nil, false, err
		}
		f.pending = md.NumPending
		s.lastPending = f.pending
		r.taken++
		if len(msgs) == 0 {
			// The first message says how many were waiting behind it;
			// they are waited for at most fillFor (maxWait stays the
			// bound of every wait).
			f.want = int(min(uint64(maxN), 1+f.pending))
			f.until = time.Now().Add(max(fillFor, f.gapFor))
			msgs = make([]source.Message, 0, maxN)
		}
		msgs = append(msgs, msg)
	}
	if r.complete() {
		s.end(r)
	} else {
		s.keepOpen(r)
	}
	return msgs, false, nil
}

// filling is take's state after a batch's first message: the backlog the
// last message reported, how many messages take wants, and until when it
// waits for them.
type filling struct {
	gapFor  time.Duration // Timing.FillGap
	pending uint64
	want    int
	until   time.Time
	gap     *time.Timer
}

func (f *filling) stop() {
	if f.gap != nil {
		f.gap.Stop()
	}
}

// next returns the batch's next message (ok false: the batch ended). stop
// says take returns what it has: nothing has arrived and either the
// backlog there was when take began is taken, or filling has run past its
// bound, or no message came within the fill gap. Later arrivals are not
// waited for (a steady stream would otherwise keep one take going until its
// batch is full).
func (f *filling) next(batch jetstream.MessageBatch, have int) (m jetstream.Msg, ok, stop bool) {
	select {
	case m, ok = <-batch.Messages():
		return m, ok, false
	default:
	}
	if f.pending == 0 || have >= f.want || !time.Now().Before(f.until) {
		return nil, false, true
	}
	if f.gap == nil {
		f.gap = time.NewTimer(f.gapFor)
	} else {
		f.gap.Reset(f.gapFor)
	}
	select {
	case m, ok = <-batch.Messages():
		return m, ok, false
	case <-f.gap.C:
		return nil, false, true
	}
}

// stallTimer fires Timing.NoWaitStall after it was (re)started; never when
// that is zero.
type stallTimer struct{ t *time.Timer }

func newStallTimer(d time.Duration) stallTimer {
	if d <= 0 {
		return stallTimer{}
	}
	return stallTimer{time.NewTimer(d)}
}

func (q stallTimer) C() <-chan time.Time {
	if q.t == nil {
		return nil
	}
	return q.t.C
}

func (q stallTimer) reset(d time.Duration) {
	if q.t == nil {
		return
	}
	if !q.t.Stop() {
		select {
		case <-q.t.C:
		default:
		}
	}
	q.t.Reset(d)
}

func (q stallTimer) stop() {
	if q.t != nil {
		q.t.Stop()
	}
}

// collect takes the messages of the no-wait request r (batching Fixed)
// until it ends, or until it has been quiet for Timing.NoWaitStall (then
// it stays open).
func (s *Source) collect(ctx context.Context, r *pullRequest, maxN int) ([]source.Message, error) {
	msgs := make([]source.Message, 0, maxN)
	quiet := newStallTimer(s.timing.NoWaitStall)
	defer quiet.stop()
	for {
		select {
		case <-ctx.Done():
			// Whatever was delivered is redelivered after AckWait.
			s.end(r)
			return nil, ctx.Err()
		case <-quiet.C():
			s.keepOpen(r)
			return msgs, nil
		case m, ok := <-r.batch.Messages():
			if !ok {
				s.end(r)
				return s.finish(msgs, r.batch.Error())
			}
			msg, md, err := convertMeta(m)
			if err != nil {
				s.end(r)
				return nil, err
			}
			s.lastPending = md.NumPending
			r.taken++
			msgs = append(msgs, msg)
			quiet.reset(s.timing.NoWaitStall)
		}
	}
}

// collectAll takes every message of the waiting request r until it ends,
// or, past r.until (its expiry, see Timing.ExpiryGrace), what it has
// delivered; then r is late.
func (s *Source) collectAll(ctx context.Context, r *pullRequest, maxN int) ([]source.Message, error) {
	msgs := make([]source.Message, 0, maxN)
	expiry, stopExpiry := r.expiry()
	defer stopExpiry()
	expired := false
	for {
		var m jetstream.Msg
		var ok bool
		if expired {
			if m, ok = ready(r.batch); m == nil && ok {
				s.retire(r)
				return msgs, nil
			}
		} else {
			select {
			case <-ctx.Done():
				s.end(r)
				return nil, ctx.Err()
			case <-expiry:
				expired = true
				continue
			case m, ok = <-r.batch.Messages():
			}
		}
		if !ok {
			s.end(r)
			return s.finish(msgs, r.batch.Error())
		}
		msg, err := convert(m)
		if err != nil {
			s.end(r)
			return nil, err
		}
		r.taken++
		msgs = append(msgs, msg)
	}
}

// finish returns the batch; a pull error after some messages arrived is only
// logged, so those messages are processed rather than left to AckWait.
func (s *Source) finish(msgs []source.Message, err error) ([]source.Message, error) {
	if err == nil {
		return msgs, nil
	}
	if len(msgs) > 0 {
		s.log.Error(err, "JetStream pull request ended with an error after some messages", "messages", len(msgs))
		return msgs, nil
	}
	return nil, fmt.Errorf("while fetching from JetStream: %w", err)
}
