package jetstream

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// Fetch returns up to maxN messages.
//
// It first takes what is available right away (a no-wait pull request, or
// the request sent ahead by the previous Fetch); a backlog fills the batch.
// When nothing is available it waits, at most maxWait:
//   - batching Adaptive (the default): for the first message, which it
//     returns with whatever else has arrived by then, from a waiting
//     request that stays open for the next Fetch if it has more to give;
//   - batching Fixed (the loop before adaptive batching): for a whole batch.
//
// On a server that may drop an expired request without a status (before
// 2.10), a waiting request is not waited on past its expiry (see
// Timing.ExpiryGrace): it is given up, and what it still delivers is taken
// by a later Fetch (checked each time a Fetch starts or its wait ends, not
// while it waits). The pull requests' states and moves: reqState.
//
// A Fetch that returns messages sends the pull request of the next Fetch
// before it returns (one request ahead, no-wait, the same size), so the
// next batch travels while the caller commits this one: a fetch's round
// trip and the server's work on it are off the loop's path. The batch
// ahead is at most one more batch delivered and not yet acknowledged; the
// runtime sizes MaxAckPending for it (config.Delivery.SizedUnacked). Close
// gives it back (NAK). While the loop holds on a misconfigured sink it sits
// delivered: past AckWait the server redelivers its messages, and the inbox
// settles whichever copy commits second as a duplicate.
func (s *Source) Fetch(ctx context.Context, maxN int, maxWait time.Duration) ([]source.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if maxN <= 0 {
		return nil, nil
	}
	s.fitTiming()
	if s.ahead != nil && s.ahead.n > maxN {
		s.giveBackAhead() // asked for more than this call may return
	}
	wait := time.NewTimer(max(maxWait, time.Millisecond))
	defer wait.Stop()
	for {
		if s.late != nil {
			// Delivered before what the request ahead delivers.
			if msgs, err := s.takeLate(maxN); err != nil || len(msgs) > 0 {
				return msgs, err
			}
		}
		msgs, timedOut, err := s.takeAhead(ctx, maxN, wait.C, maxWait)
		if err != nil || len(msgs) > 0 {
			return msgs, err
		}
		if timedOut || maxWait <= 0 {
			return nil, nil
		}
		if s.ahead != nil {
			continue // a request still open: wait for its first message
		}
		// Caught up: wait (long poll).
		msgs, done, err := s.longPoll(ctx, maxN, maxWait)
		if done {
			return msgs, err
		}
	}
}

// takeAhead takes what the request ahead delivers, sending it first if
// there is none, and sends the next one when it returns messages. timedOut
// says wait fired before any message.
func (s *Source) takeAhead(ctx context.Context, maxN int, wait <-chan time.Time, maxWait time.Duration) (msgs []source.Message, timedOut bool, err error) {
	if s.ahead == nil {
		batch, err := s.consumer.FetchNoWait(maxN)
		if err != nil {
			return nil, false, fmt.Errorf("while fetching from JetStream: %w", err)
		}
		s.ahead = newRequest(batch, maxN, reqSent, time.Time{})
	}
	r := s.ahead
	if r.state == reqOpen || !s.fixed {
		// Adaptive: what the request has delivered and what the server
		// says is pending behind it, not what arrives later. (A no-wait
		// request for which messages were pending when it arrived stays
		// open on the server and keeps taking new ones until its batch is
		// full: at 10% load collecting it to its end held a fetch for up
		// to 0.9 s.)
		msgs, timedOut, err = s.take(ctx, r, maxN, wait, maxWait)
	} else {
		msgs, err = s.collect(ctx, r, maxN)
	}
	if !r.live() {
		s.ahead = nil // ended, or given up (late)
	}
	if err != nil || len(msgs) == 0 {
		return nil, timedOut, err
	}
	if !s.fixed && s.ahead == nil && len(msgs) < maxN && s.lastPending == 0 {
		if msgs, err = s.topUp(ctx, msgs, maxN); err != nil {
			return nil, false, err
		}
	}
	if s.ahead == nil {
		s.requestAhead(maxN)
	}
	return msgs, false, nil
}

// longPoll sends a waiting pull request once the consumer is caught up.
// With batching Fixed it collects the whole batch (or what came within
// maxWait) and done says Fetch returns it; with Adaptive the request
// becomes the open request ahead and Fetch waits for its first message.
func (s *Source) longPoll(ctx context.Context, maxN int, maxWait time.Duration) (msgs []source.Message, done bool, err error) {
	var until time.Time // zero: the server ends it (a 408 at its expiry)
	if s.timing.ExpiryGrace > 0 {
		until = time.Now().Add(maxWait + s.timing.ExpiryGrace)
	}
	batch, err := s.consumer.Fetch(maxN, jetstream.FetchMaxWait(maxWait))
	if err != nil {
		return nil, true, fmt.Errorf("while fetching from JetStream: %w", err)
	}
	if !s.fixed {
		s.ahead = newRequest(batch, maxN, reqOpen, until)
		return nil, false, nil
	}
	r := newRequest(batch, maxN, reqSent, until)
	s.ahead = r
	msgs, err = s.collectAll(ctx, r, maxN)
	s.ahead = nil
	if err == nil && len(msgs) > 0 {
		s.requestAhead(maxN)
	}
	return msgs, true, err
}

// topUp adds to a part batch what is available now. The request ahead
// holds what was there when it was sent, as the previous Fetch returned;
// while the caller committed, more may have arrived: with batching
// Adaptive those join this batch (one more no-wait request) instead of
// waiting for the next one, so a busy pipeline commits what accumulated
// in one transaction, as a group commit does.
func (s *Source) topUp(ctx context.Context, msgs []source.Message, maxN int) ([]source.Message, error) {
	batch, err := s.consumer.FetchNoWait(maxN - len(msgs))
	if err != nil {
		return msgs, nil // the next Fetch sends its own request and reports it
	}
	r := newRequest(batch, maxN-len(msgs), reqSent, time.Time{})
	s.ahead = r
	quiet := newStallTimer(s.timing.NoWaitStall)
	defer quiet.stop()
	more, _, err := s.take(ctx, r, maxN-len(msgs), quiet.C(), s.timing.NoWaitStall)
	if !r.live() {
		s.ahead = nil
	}
	if err != nil {
		// The part batch in hand is good; what the top-up delivered is
		// redelivered after AckWait.
		s.log.Error(err, "JetStream top-up request failed after a part batch", "messages", len(msgs))
		return msgs, nil
	}
	return append(msgs, more...), nil
}

// fitTiming follows the server the connection is on: after a reconnect to
// a server of another version the defaults are that server's (unless
// WithTiming set them).
func (s *Source) fitTiming() {
	if s.nc == nil || s.timingSet {
		return
	}
	if v := s.nc.ConnectedServerVersion(); v != "" && v != s.timedFor {
		s.timedFor, s.timing = v, DefaultTiming(v)
		s.log.Info("NATS server version sets the pull timing", "serverVersion", v, "timing", s.timing.String())
	}
}
