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

// first waits for batch's first message, at most until wait fires or the
// request is past its expiry (expired).
func (s *Source) first(ctx context.Context, batch jetstream.MessageBatch, wait, expired <-chan time.Time) (jetstream.Msg, bool, firstWait) {
	select {
	case <-ctx.Done():
		return nil, false, firstCancelled
	case <-wait:
		return nil, false, firstTimedOut
	case m, ok := <-batch.Messages():
		return m, ok, firstArrived
	case <-expired:
		if m, ok := ready(batch); m != nil || !ok {
			return m, ok, firstArrived
		}
		s.retire(batch)
		return nil, false, firstExpired
	}
}

// ready is batch's next message if one has arrived: (nil, true) when none
// has, ok false when the batch ended.
func ready(batch jetstream.MessageBatch) (jetstream.Msg, bool) {
	select {
	case m, ok := <-batch.Messages():
		return m, ok
	default:
		return nil, true
	}
}

// fillGap bounds the wait for the next message of a burst the server said
// is pending (a backlog): a batch fills from it, but a message another
// replica's request took is not waited for longer than this.
const fillGap = 20 * time.Millisecond

// take waits (until wait fires) for batch's first message, then takes the
// messages batch has delivered, up to maxN, and, while the last one says
// more are pending on the server, waits up to fillGap for each next one.
// ended says the request is complete (every message it will deliver was
// taken); timedOut that wait fired before any message.
func (s *Source) take(ctx context.Context, maxN int, wait <-chan time.Time, fillFor time.Duration) (msgs []source.Message, ended, timedOut bool, err error) {
	batch := s.ahead
	var f filling
	defer f.stop()
	expired, stopExpiry := s.expiry()
	defer stopExpiry()
	for len(msgs) < maxN {
		if s.aheadTaken >= s.aheadN {
			// Every message the request asked for was taken: it is
			// complete (nats.go closes it right after the last).
			return msgs, true, false, nil
		}
		var m jetstream.Msg
		var ok bool
		if len(msgs) == 0 {
			var w firstWait
			switch m, ok, w = s.first(ctx, batch, wait, expired); w {
			case firstCancelled:
				// Whatever was delivered is redelivered after AckWait.
				return nil, true, false, ctx.Err()
			case firstTimedOut:
				return nil, false, true, nil // the request stays open for the next Fetch
			case firstExpired:
				return nil, true, false, nil // given up: the next Fetch sends another
			case firstArrived:
			}
		} else {
			var stop bool
			if m, ok, stop = f.next(batch, len(msgs)); stop {
				return msgs, false, false, nil
			}
		}
		if !ok {
			msgs, err := s.finish(msgs, batch.Error())
			return msgs, true, false, err
		}
		msg, md, err := convertMeta(m)
		if err != nil {
			return nil, true, false, err
		}
		f.pending = md.NumPending
		s.lastPending = f.pending
		s.aheadTaken++
		if len(msgs) == 0 {
			// The first message says how many were waiting behind it;
			// they are waited for at most fillFor (maxWait stays the
			// bound of every wait).
			f.want = int(min(uint64(maxN), 1+f.pending))
			f.until = time.Now().Add(max(fillFor, fillGap))
			msgs = make([]source.Message, 0, maxN)
		}
		msgs = append(msgs, msg)
	}
	return msgs, s.aheadTaken >= s.aheadN, false, nil
}

// filling is take's state after a batch's first message: the backlog the
// last message reported, how many messages take wants, and until when it
// waits for them.
type filling struct {
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
// bound, or no message came within fillGap. Later arrivals are not waited
// for (a steady stream would otherwise keep one take going until its
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
		f.gap = time.NewTimer(fillGap)
	} else {
		f.gap.Reset(fillGap)
	}
	select {
	case m, ok = <-batch.Messages():
		return m, ok, false
	case <-f.gap.C:
		return nil, false, true
	}
}

// noWaitStall bounds how long collect waits on a no-wait request that has
// gone quiet. The server answers one at once unless another replica's
// waiting request takes the messages it was queued for; then it may stay
// unanswered, and nats.go ends it only after a second (measured: one-second
// stalls of the whole loop at 10% load with two replicas). Past this, the
// request is kept as an open one: the next Fetch takes what it still
// delivers, so nothing is stranded.
const noWaitStall = 50 * time.Millisecond

// collect takes the messages of the no-wait request ahead until it ends
// (ended), or until it has been quiet for noWaitStall (then it stays open).
func (s *Source) collect(ctx context.Context, maxN int) ([]source.Message, bool, error) {
	batch := s.ahead
	msgs := make([]source.Message, 0, maxN)
	quiet := time.NewTimer(noWaitStall)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			// Whatever was delivered is redelivered after AckWait.
			return nil, true, ctx.Err()
		case <-quiet.C:
			s.aheadOpen, s.aheadTaken = true, len(msgs)
			return msgs, false, nil
		case m, ok := <-batch.Messages():
			if !ok {
				msgs, err := s.finish(msgs, batch.Error())
				return msgs, true, err
			}
			msg, md, err := convertMeta(m)
			if err != nil {
				return nil, true, err
			}
			s.lastPending = md.NumPending
			msgs = append(msgs, msg)
			if !quiet.Stop() {
				<-quiet.C
			}
			quiet.Reset(noWaitStall)
		}
	}
}

// collectAll takes every message of the waiting request batch until it
// ends, or, past until (its expiry, see expiryGrace), what it has
// delivered.
func (s *Source) collectAll(ctx context.Context, batch jetstream.MessageBatch, maxN int, until time.Time) ([]source.Message, error) {
	msgs := make([]source.Message, 0, maxN)
	expiry := time.NewTimer(time.Until(until))
	defer expiry.Stop()
	expired := false
	for {
		var m jetstream.Msg
		var ok bool
		if expired {
			if m, ok = ready(batch); m == nil && ok {
				s.retire(batch)
				return msgs, nil
			}
		} else {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-expiry.C:
				expired = true
				continue
			case m, ok = <-batch.Messages():
			}
		}
		if !ok {
			return s.finish(msgs, batch.Error())
		}
		msg, err := convert(m)
		if err != nil {
			return nil, err
		}
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
