package jetstream

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// fourReplicas is the declared scale of the limit tests: 4 replicas x 500 x
// 2 in flight.
var fourReplicas = config.Delivery{BatchSize: 500, InFlight: 2, Replicas: 4}

func (f *fixture) publishN(t *testing.T, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for i := range n {
		if _, err := f.js.PublishAsync(f.subject+".orders", fmt.Appendf(nil, `{"n":%d}`, i)); err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	select {
	case <-f.js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishing did not complete")
	}
}

func (f *fixture) maxAckPending(t *testing.T, consumer string) int {
	t.Helper()
	c, err := f.js.Consumer(t.Context(), f.stream, consumer)
	if err != nil {
		t.Fatal(err)
	}
	return c.CachedInfo().Config.MaxAckPending
}

// A consumer the runtime creates holds every replica's in-flight batches:
// four replicas each take two full batches of 500 and acknowledge nothing
// (8 x 500 = 4,000 unacknowledged, plus the batch each has requested
// ahead). With the server's default MaxAckPending of 1,000 the third batch
// would come back empty.
func TestCreatedConsumerFillsDeclaredReplicas(t *testing.T) {
	onServers(t, testCreatedConsumerFillsDeclaredReplicas)
}

func testCreatedConsumerFillsDeclaredReplicas(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	total := fourReplicas.MinUnacked(fourReplicas.Replicas)
	// More than the replicas take, so no fetch comes back short because the
	// stream ran out (the requests ahead take their share too).
	f.publishN(t, 2*total)
	srcs := make([]*Source, fourReplicas.Replicas)
	for i := range srcs {
		s, err := New(t.Context(), f.cfg("sized"), testr.New(t), WithDelivery(fourReplicas), WithClientName(fmt.Sprintf("replica-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		srcs[i] = s
	}
	if got, want := f.maxAckPending(t, "sized"), 4*total; got != want {
		t.Errorf("MaxAckPending = %d, want 4 x 4 replicas x 500 x 2 in flight = %d", got, want)
	}
	for round := range fourReplicas.InFlight {
		for i, s := range srcs {
			msgs, err := s.Fetch(t.Context(), fourReplicas.BatchSize, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) != fourReplicas.BatchSize {
				t.Fatalf("replica %d batch %d: fetched %d of %d with %d unacknowledged: the consumer's limit stalls the declared scale",
					i, round, len(msgs), fourReplicas.BatchSize, (round*len(srcs)+i)*fourReplicas.BatchSize)
			}
		}
	}
}

// A consumer the runtime created for one replica grows when the runtime
// starts with a larger declared scale; a user-made one is never changed.
func TestOwnConsumerGrowsUserConsumerIsKept(t *testing.T) {
	onServers(t, testOwnConsumerGrowsUserConsumerIsKept)
}

func testOwnConsumerGrowsUserConsumerIsKept(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	one := fourReplicas
	one.Replicas = 1
	s, err := New(t.Context(), f.cfg("grows"), testr.New(t), WithDelivery(one))
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if got := f.maxAckPending(t, "grows"); got != one.SizedUnacked(1) {
		t.Fatalf("created with MaxAckPending %d, want %d", got, one.SizedUnacked(1))
	}
	s, err = New(t.Context(), f.cfg("grows"), testr.New(t), WithDelivery(fourReplicas))
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if got, want := f.maxAckPending(t, "grows"), fourReplicas.SizedUnacked(4); got != want {
		t.Errorf("after scaling to 4 replicas MaxAckPending = %d, want %d", got, want)
	}

	if _, err := f.js.CreateConsumer(t.Context(), f.stream, jetstream.ConsumerConfig{
		Durable: "users", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 100,
	}); err != nil {
		t.Fatal(err)
	}
	s, err = New(t.Context(), f.cfg("users"), testr.New(t), WithDelivery(fourReplicas))
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if got := f.maxAckPending(t, "users"); got != 100 {
		t.Errorf("the user's consumer was changed: MaxAckPending %d, want 100", got)
	}
}

func TestAckPendingTooSmall(t *testing.T) {
	for _, tc := range []struct {
		limit, needed int
		want          bool
	}{{100, 4000, true}, {1000, 1000, false}, {-1, 4000, false}, {0, 4000, false}, {8000, 4000, false}} {
		if got := AckPendingTooSmall(tc.limit, tc.needed); got != tc.want {
			t.Errorf("AckPendingTooSmall(%d, %d) = %v, want %v", tc.limit, tc.needed, got, tc.want)
		}
	}
}
