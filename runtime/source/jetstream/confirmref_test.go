package jetstream

import (
	"testing"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// What the consumer keeps of a message while its ack awaits confirmation is
// the subject the ack goes to, which ConfirmAcks sends the ack to again
// after a reconnect.
func TestConfirmRefKeepsTheAckSubject(t *testing.T) {
	s := &Source{}
	kept := s.ConfirmRef(source.Message{Ref: ackReply("$JS.ACK.ORDERS.c.1.7.7.0.0")})
	if got := ackSubject(source.Message{Ref: kept}); got != "$JS.ACK.ORDERS.c.1.7.7.0.0" {
		t.Fatalf("the kept ack subject is %q", got)
	}
	if _, isMsg := kept.(ackReply); !isMsg {
		t.Fatalf("ConfirmRef kept %T, want the ack subject alone", kept)
	}
	if got := ackSubject(source.Message{Ref: "something else"}); got != "" {
		t.Fatalf("ackSubject of a foreign Ref = %q, want none", got)
	}
}
