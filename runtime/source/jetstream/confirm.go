package jetstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// ackPayload is JetStream's positive acknowledgement.
var ackPayload = []byte("+ACK")

// ConfirmAcks proves that the acknowledgements of batches reached the
// server: a PING/PONG round trip (FlushTimeout) on the connection they were
// written to. The server handles a connection's messages in order, so its
// PONG comes after it read every ack written before the PING. Acks written
// to a connection that was replaced since the last confirming round trip
// may have been lost with it (a half-open connection swallows what it is
// given): they are sent again first (acknowledging twice is harmless). A
// reconnect during the round trip confirms nothing.
func (s *Source) ConfirmAcks(ctx context.Context, batches [][]source.Message) ([]bool, error) {
	s.confirmMu.Lock()
	defer s.confirmMu.Unlock()
	ok := make([]bool, len(batches))
	gen := s.nc.Stats().Reconnects
	if gen != s.confirmedGen {
		if !s.nc.IsConnected() {
			return ok, fmt.Errorf("NATS is not connected (%s): acknowledgements cannot be confirmed", s.nc.Status())
		}
		resent := 0
		for _, b := range batches {
			for _, m := range b {
				reply := ackSubject(m)
				if reply == "" {
					continue
				}
				if err := s.nc.Publish(reply, ackPayload); err != nil {
					return ok, fmt.Errorf("while acknowledging %s again on the new connection: %w", m.NativeID, err)
				}
				resent++
			}
		}
		s.log.Info("the NATS connection was replaced since acknowledgements were last confirmed; sent them again", "acknowledgements", resent)
	}
	timeout := flushTimeout
	if d, has := ctx.Deadline(); has {
		timeout = min(timeout, time.Until(d))
	}
	if timeout <= 0 {
		return ok, fmt.Errorf("no time left to confirm acknowledgements: %w", context.DeadlineExceeded)
	}
	if err := s.nc.FlushTimeout(timeout); err != nil {
		return ok, fmt.Errorf("while confirming acknowledgements with a round trip to the NATS server: %w", err)
	}
	if after := s.nc.Stats().Reconnects; after != gen {
		return ok, errors.New("the NATS connection was replaced during the confirming round trip; acknowledgements are confirmed on the next one")
	}
	s.confirmedGen = gen
	for i := range ok {
		ok[i] = true
	}
	return ok, nil
}

// ackReply is what is kept of a message while its ack awaits confirmation
// (ConfirmRef): the subject its ack is published to.
type ackReply string

// ConfirmRef keeps the ack subject alone, not the message and its data.
func (s *Source) ConfirmRef(m source.Message) any {
	return ackReply(ackSubject(m))
}

// ackSubject is the subject a message's ack goes to, from its Ref (the
// message, or what ConfirmRef kept of it).
func ackSubject(m source.Message) string {
	switch r := m.Ref.(type) {
	case ackReply:
		return string(r)
	case jetstream.Msg:
		return r.Reply()
	}
	return ""
}

// ConsumerCreated is when the server created the durable consumer.
func (s *Source) ConsumerCreated() time.Time { return s.created }
