package jetstream

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// never is a maxWait no test outlives: a Fetch that returns at all did not
// wait for it.
const never = time.Hour

// fetchGuard bounds how long a test waits for a Fetch that must return at
// once; it only turns a hang (a Fetch waiting out never) into a failure.
const fetchGuard = time.Minute

func fetchAsync(ctx context.Context, s *Source, maxN int, maxWait time.Duration) <-chan fetched {
	out := make(chan fetched, 1)
	go func() {
		msgs, err := s.Fetch(ctx, maxN, maxWait)
		out <- fetched{msgs, err}
	}()
	return out
}

type fetched struct {
	msgs []source.Message
	err  error
}

// fetchRest fetches (maxN 1000, no idle wait) until got holds n messages;
// a Fetch that returns nothing while some are still waiting fails the test.
func fetchRest(t *testing.T, s *Source, got []source.Message, n int) []source.Message {
	t.Helper()
	for len(got) < n {
		more := waitFetch(t, fetchAsync(t.Context(), s, 1000, never))
		if len(more) == 0 {
			t.Fatalf("a Fetch returned nothing with %d of %d messages still waiting", n-len(got), n)
		}
		got = append(got, more...)
	}
	return got
}

func waitFetch(t *testing.T, ch <-chan fetched) []source.Message {
	t.Helper()
	select {
	case f := <-ch:
		if f.err != nil {
			t.Fatal(f.err)
		}
		return f.msgs
	case <-time.After(fetchGuard):
		t.Fatalf("Fetch has not returned: it waits for a batch that is not coming (maxWait %s)", never)
		return nil
	}
}

// Adaptive batching, idle: a Fetch that finds less than a batch does not
// wait for the batch to fill. Three messages published while a Fetch of
// 1,000 waits (maxWait an hour) come back at once, with the first or with
// the next Fetch, which does not wait either.
func TestAdaptiveFetchReturnsWhatArrivedWithoutWaitingForABatch(t *testing.T) {
	onServers(t, testAdaptiveFetchReturnsWhatArrivedWithoutWaitingForABatch)
}

func testAdaptiveFetchReturnsWhatArrivedWithoutWaitingForABatch(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	s, err := New(t.Context(), f.cfg("adaptive-idle"), testr.New(t), WithDelivery(config.Delivery{BatchSize: 500, InFlight: 2, Replicas: 1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	first := fetchAsync(t.Context(), s, 1000, never)
	f.publishN(t, 3)
	got := waitFetch(t, first)
	if len(got) == 0 {
		t.Fatal("the first Fetch returned nothing although messages arrived")
	}
	got = fetchRest(t, s, got, 3)
	if len(got) != 3 {
		t.Fatalf("fetched %d messages, want 3", len(got))
	}
	if err := s.Ack(t.Context(), got); err != nil {
		t.Fatal(err)
	}
}

// Adaptive batching, backlog: when more than a batch waits, every Fetch
// returns a whole batch (and the last one the rest), never a part of what
// is there.
func TestAdaptiveFetchFillsTheBatchUnderBacklog(t *testing.T) {
	onServers(t, testAdaptiveFetchFillsTheBatchUnderBacklog)
}

func testAdaptiveFetchFillsTheBatchUnderBacklog(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	f.publishN(t, 2500)
	s, err := New(t.Context(), f.cfg("adaptive-backlog"), testr.New(t), WithDelivery(config.Delivery{BatchSize: 500, InFlight: 2, Replicas: 1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	for i, want := range []int{1000, 1000, 500} {
		msgs := waitFetch(t, fetchAsync(t.Context(), s, 1000, never))
		if len(msgs) != want {
			t.Fatalf("fetch %d under a backlog returned %d messages, want %d", i, len(msgs), want)
		}
		if err := s.Ack(t.Context(), msgs); err != nil {
			t.Fatal(err)
		}
	}
}

// After an idle wait the open request keeps delivering: a backlog that
// builds up behind it is taken in whole batches again once it ends.
func TestAdaptiveFetchFillsAgainAfterAnIdleWait(t *testing.T) {
	onServers(t, testAdaptiveFetchFillsAgainAfterAnIdleWait)
}

func testAdaptiveFetchFillsAgainAfterAnIdleWait(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	s, err := New(t.Context(), f.cfg("adaptive-mixed"), testr.New(t), WithDelivery(config.Delivery{BatchSize: 100, InFlight: 1, Replicas: 1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	first := fetchAsync(t.Context(), s, 100, 2*time.Second)
	f.publishN(t, 1000)
	total := len(waitFetch(t, first))
	full := 0
	for total < 1000 {
		msgs := waitFetch(t, fetchAsync(t.Context(), s, 100, 2*time.Second))
		if len(msgs) == 0 {
			t.Fatalf("a Fetch returned nothing with %d messages waiting", 1000-total)
		}
		if len(msgs) == 100 {
			full++
		}
		total += len(msgs)
		if err := s.Ack(t.Context(), msgs); err != nil {
			t.Fatal(err)
		}
	}
	if total != 1000 {
		t.Fatalf("fetched %d messages, want 1000", total)
	}
	// The open request ends after 100 messages at most; from then on
	// every no-wait request finds the backlog and fills.
	if full < 7 {
		t.Fatalf("only %d of the fetches after the idle wait were whole batches of 100, want at least 7", full)
	}
}
