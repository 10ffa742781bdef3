package jetstream

import (
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// silentRequest is a waiting pull request the server dropped at its expiry
// without the "408 Request Timeout" status (nats-server before 2.9.15 does
// so when a new message finds the request expired): its batch delivers
// nothing and nats.go ends it only a second after its last message. A test
// may still send a message on it (a late delivery) or end it.
type silentRequest struct{ msgs chan jetstream.Msg }

func newSilentRequest() *silentRequest { return &silentRequest{msgs: make(chan jetstream.Msg, 10)} }

func (r *silentRequest) Messages() <-chan jetstream.Msg { return r.msgs }
func (r *silentRequest) Error() error                   { return nil }

// An open waiting request past its expiry is not waited on: the Fetch
// sends another request and returns what was published, instead of
// waiting (here up to an hour; with nats.go, a second) for a request the
// server no longer holds.
func TestFetchGivesUpAWaitingRequestPastItsExpiry(t *testing.T) {
	onServers(t, testFetchGivesUpAWaitingRequestPastItsExpiry)
}

func testFetchGivesUpAWaitingRequestPastItsExpiry(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	s, err := New(t.Context(), f.cfg("expired"), testr.New(t), WithDelivery(config.Delivery{BatchSize: 500, InFlight: 2, Replicas: 1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	dead := newSilentRequest()
	s.ahead = newRequest(dead, 1000, reqOpen, time.Now().Add(-time.Millisecond))
	f.publishN(t, 3)
	start := time.Now()
	got := waitFetch(t, fetchAsync(t.Context(), s, 1000, never))
	got = fetchRest(t, s, got, 3)
	if len(got) != 3 {
		t.Fatalf("got %d messages, want 3", len(got))
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the Fetches took %s: they waited on the expired request", took)
	}
	if s.late == nil || s.late.batch != dead {
		t.Errorf("the given-up request is not kept for its late deliveries")
	}
}

// A message the given-up request still delivers (the server was late, not
// silent) is returned by the next Fetch, not given back or left to
// AckWait; once nats.go ends the request it is dropped. batching Fixed
// gives a long poll up the same way.
func TestLateDeliveryOfAGivenUpRequestIsTaken(t *testing.T) {
	onServers(t, testLateDeliveryOfAGivenUpRequestIsTaken)
}

func testLateDeliveryOfAGivenUpRequestIsTaken(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	s, err := New(t.Context(), f.cfg("late"), testr.New(t),
		WithDelivery(config.Delivery{BatchSize: 5, InFlight: 2, Replicas: 1, Batching: config.BatchingFixed}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	f.publishN(t, 1)
	real, err := s.consumer.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lateMsg, ok := <-real.Messages()
	if !ok {
		t.Fatalf("no message to deliver late: %v", real.Error())
	}
	dead := newSilentRequest()
	start := time.Now()
	type collected struct {
		msgs []source.Message
		err  error
	}
	done := make(chan collected, 1)
	go func() {
		msgs, err := s.collectAll(t.Context(), newRequest(dead, 10, reqSent, start.Add(50*time.Millisecond)), 10)
		done <- collected{msgs, err}
	}()
	// fetchGuard turns a hang into a failure: a collectAll that does not
	// give the silent request up at its expiry never returns.
	guard := time.NewTimer(fetchGuard)
	defer guard.Stop()
	select {
	case c := <-done:
		if c.err != nil || len(c.msgs) != 0 {
			t.Fatalf("collectAll of a silent request: %d messages, %v", len(c.msgs), c.err)
		}
	case <-guard.C:
		t.Fatalf("collectAll of a silent request has not returned %s after the request's 50 ms expiry: it does not give up an expired request", fetchGuard)
	}
	if s.late == nil || s.late.batch != dead {
		t.Fatal("the given-up request is not kept for its late deliveries")
	}
	dead.msgs <- lateMsg
	got, err := s.Fetch(t.Context(), 10, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Ref != lateMsg {
		t.Fatalf("the Fetch after a late delivery returned %d messages, want the late one", len(got))
	}
	if err := s.Ack(t.Context(), got); err != nil {
		t.Fatal(err)
	}
	close(dead.msgs)
	if _, err := s.Fetch(t.Context(), 10, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if s.late != nil {
		t.Error("the late request is kept after it ended")
	}
}
