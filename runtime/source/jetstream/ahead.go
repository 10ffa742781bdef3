package jetstream

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// requestAhead sends the no-wait pull request of the next Fetch. An error
// here is not this fetch's: the next Fetch sends its own request and
// reports it.
func (s *Source) requestAhead(maxN int) {
	batch, err := s.consumer.FetchNoWait(maxN)
	if err != nil {
		s.ahead = nil
		return
	}
	s.setAhead(batch, maxN, false, time.Time{})
}

// setAhead makes batch, a pull request of n messages, the request ahead.
// until is when a waiting request has expired for sure (zero for a no-wait
// one).
func (s *Source) setAhead(batch jetstream.MessageBatch, n int, open bool, until time.Time) {
	s.ahead, s.aheadN, s.aheadOpen, s.aheadTaken, s.aheadUntil = batch, n, open, 0, until
}

// expiryGrace is how long after a waiting request's expiry (its maxWait
// from when it was sent) the adapter stops waiting for it. The server ends
// an expired request with a "408 Request Timeout" status, and nats.go then
// ends its batch; but a server without nats-server#3942 (merged March 2023,
// after 2.9.15; Debian's 2.9.10, the benchmark's, lacks it) that finds the
// request expired while it hands out a new message drops it without the
// status, and nats.go ends the batch only a second after its last message.
// Measured at 10% load with two replicas (issue 24): 12 long polls in 12 s
// ended so, 1.2 s after they were sent, and while both replicas waited on
// dead requests the consumer had no pull request on the server and every
// message published waited (the one-second stalls that set the p99). The
// grace covers the request's way to the server and the last message's way
// back; a request that delivers later still (a loaded server) is kept as
// the late request, and what it delivers is not lost.
const expiryGrace = 20 * time.Millisecond

// retire gives up on a waiting request past its expiry: it becomes the
// late request, whose messages the next Fetch takes, if it delivers any
// (the server was late, not silent). A late request still open from
// before gives back (NAK) what it delivered and still delivers, so that is
// redelivered at once instead of after AckWait; nats.go ends its batch
// maxWait + 1 s after its last message, which ends that goroutine. Against
// a server that drops expired requests silently (nats-server 2.9) an idle
// replica gives up a long poll every cycle, so a few such goroutines
// (about 1.2 s / maxWait) stay parked per idle replica: bounded, and each
// holds nothing but the dead batch.
func (s *Source) retire(batch jetstream.MessageBatch) {
	if prev := s.late; prev != nil {
		go func() {
			for m := range prev.Messages() {
				_ = m.Nak()
			}
		}()
	}
	s.late = batch
}

// takeLate takes, without waiting, what the late request has delivered,
// up to maxN, and drops it once it ended. When it returns messages there is
// a request ahead for the next Fetch.
func (s *Source) takeLate(maxN int) ([]source.Message, error) {
	var msgs []source.Message
	for len(msgs) < maxN {
		m, ok := ready(s.late)
		if !ok {
			s.late = nil
			break
		}
		if m == nil {
			break
		}
		msg, err := convert(m)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, msg)
	}
	if len(msgs) > 0 && s.ahead == nil {
		s.requestAhead(maxN)
	}
	return msgs, nil
}

// expiry fires when the request ahead is past aheadUntil (never for a
// no-wait request). Call stop when done.
func (s *Source) expiry() (expired <-chan time.Time, stop func() bool) {
	if s.aheadUntil.IsZero() {
		return nil, func() bool { return false }
	}
	t := time.NewTimer(time.Until(s.aheadUntil))
	return t.C, t.Stop
}

// giveBackAhead NAKs the messages of the batch requested ahead (nobody asked
// for them yet), so the server redelivers them at once to another replica
// instead of after AckWait (30 s by default). A given-back message counts
// one delivery, as its redelivery after AckWait would. Batches fetched and
// not started when the loop stops still wait for AckWait. It waits at most
// aheadGiveBack for the batch to arrive.
func (s *Source) giveBackAhead() {
	if s.ahead == nil {
		return
	}
	batch := s.ahead
	open := s.aheadOpen
	s.ahead, s.aheadOpen = nil, false
	deadline := time.NewTimer(aheadGiveBack)
	defer deadline.Stop()
	naked := 0
	for open {
		// A waiting request may stay open up to maxWait with nothing to
		// deliver: give back what it delivered, without waiting for it
		// to end (a message still on its way is redelivered after
		// AckWait).
		select {
		case m, ok := <-batch.Messages():
			if !ok {
				return
			}
			if err := m.Nak(); err == nil {
				naked++
			}
		default:
			if naked > 0 {
				s.log.Info("gave back the messages of the open request", "messages", naked)
			}
			return
		}
	}
	for {
		select {
		case m, ok := <-batch.Messages():
			if !ok {
				if naked > 0 {
					s.log.Info("gave back the batch requested ahead", "messages", naked)
				}
				return
			}
			if err := m.Nak(); err == nil {
				naked++
			}
		case <-deadline.C:
			return // the rest is redelivered after AckWait
		}
	}
}

// giveBackLate NAKs what the late request has delivered, without waiting
// for more (what it still delivers is redelivered after AckWait).
func (s *Source) giveBackLate() {
	if s.late == nil {
		return
	}
	naked := 0
	for m, ok := ready(s.late); ok && m != nil; m, ok = ready(s.late) {
		if m.Nak() == nil {
			naked++
		}
	}
	s.late = nil
	if naked > 0 {
		s.log.Info("gave back the messages of a pull request given up after its expiry", "messages", naked)
	}
}

// aheadGiveBack bounds how long Close waits for the batch requested ahead.
const aheadGiveBack = time.Second
