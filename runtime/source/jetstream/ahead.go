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
	s.ahead = newRequest(batch, maxN, reqSent, time.Time{})
}

// takeLate takes, without waiting, what the late request has delivered,
// up to maxN, and drops it once it ended. When it returns messages there is
// a request ahead for the next Fetch.
func (s *Source) takeLate(maxN int) ([]source.Message, error) {
	r := s.late
	var msgs []source.Message
	for len(msgs) < maxN {
		m, ok := ready(r.batch)
		if !ok {
			s.end(r)
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
		r.taken++
		msgs = append(msgs, msg)
	}
	if len(msgs) > 0 && s.ahead == nil {
		s.requestAhead(maxN)
	}
	return msgs, nil
}

// giveBackAhead NAKs the messages of the batch requested ahead (nobody asked
// for them yet), so the server redelivers them at once to another replica
// instead of after AckWait (30 s by default). A given-back message counts
// one delivery, as its redelivery after AckWait would. Batches fetched and
// not started when the loop stops still wait for AckWait. It waits at most
// aheadGiveBack for the batch to arrive.
func (s *Source) giveBackAhead() {
	r := s.ahead
	if r == nil {
		return
	}
	s.ahead = nil
	defer s.end(r)
	batch := r.batch
	deadline := time.NewTimer(aheadGiveBack)
	defer deadline.Stop()
	naked := 0
	for r.state == reqOpen {
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
	r := s.late
	if r == nil {
		return
	}
	naked := 0
	for m, ok := ready(r.batch); ok && m != nil; m, ok = ready(r.batch) {
		if m.Nak() == nil {
			naked++
		}
	}
	s.end(r)
	s.late = nil
	if naked > 0 {
		s.log.Info("gave back the messages of a pull request given up after its expiry", "messages", naked)
	}
}

// aheadGiveBack bounds how long Close waits for the batch requested ahead.
const aheadGiveBack = time.Second

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
