package redisstreams

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
	"github.com/idempotency-dev/idc-operator/runtime/source/sourcetest"
)

// redisAddr is the Redis server the machine runs on loopback. The tests fail
// (they do not skip) when it is down.
const redisAddr = "127.0.0.1:6379"

type fixture struct {
	rdb    *redis.Client
	stream string
	group  string
	n      atomic.Int64
}

// newFixture names a stream private to the test and deletes it afterwards.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s is required for this test: %v", redisAddr, err)
	}
	id := time.Now().UnixNano()
	f := &fixture{rdb: rdb, stream: fmt.Sprintf("idc-test-%d", id), group: fmt.Sprintf("idc-test-group-%d", id)}
	t.Cleanup(func() {
		if err := rdb.Del(context.Background(), f.stream).Err(); err != nil {
			t.Errorf("deleting stream %s: %v", f.stream, err)
		}
		_ = rdb.Close()
	})
	return f
}

func (f *fixture) publish(t *testing.T, msgs []sourcetest.Outgoing) {
	t.Helper()
	for _, o := range msgs {
		err := f.rdb.XAdd(t.Context(), &redis.XAddArgs{
			Stream: f.stream,
			Values: []any{"body", o.Body, sourcetest.IDHeader, o.ID},
		}).Err()
		if err != nil {
			t.Fatalf("XADD: %v", err)
		}
	}
}

func (f *fixture) cfg(claimMinIdle time.Duration) *config.RedisStreams {
	return &config.RedisStreams{
		Address: redisAddr, Stream: f.stream, Group: f.group, BodyField: "body",
		ClaimMinIdle: config.Duration{Duration: claimMinIdle},
	}
}

func (f *fixture) newSource(t *testing.T, cfg *config.RedisStreams, consumer string) *Source {
	t.Helper()
	if consumer == "" {
		consumer = fmt.Sprintf("consumer-%d", f.n.Add(1))
	}
	s, err := New(t.Context(), cfg, testr.New(t), WithConsumerName(consumer))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	f := newFixture(t)
	const lease = time.Second
	sourcetest.Run(t, sourcetest.Harness{
		// Every Source is a new consumer name: redelivery goes through
		// XAUTOCLAIM once the lease expired.
		NewSource:       func(t *testing.T) source.Source { return f.newSource(t, f.cfg(lease), "") },
		Publish:         f.publish,
		MaxWait:         300 * time.Millisecond,
		RedeliveryAfter: lease + time.Second,
		ReportsAttempts: true,
	})
}

func fetchAll(t *testing.T, s *Source, n int) []source.Message {
	t.Helper()
	var out []source.Message
	for end := time.Now().Add(20 * time.Second); len(out) < n && time.Now().Before(end); {
		msgs, err := s.Fetch(t.Context(), n-len(out), 200*time.Millisecond)
		if err != nil {
			t.Fatalf("Fetch: %v", err)
		}
		out = append(out, msgs...)
	}
	if len(out) != n {
		t.Fatalf("fetched %d entries, want %d", len(out), n)
	}
	return out
}

// TestSameConsumerNameRecoversAtOnce: a restarted process with the same
// consumer name gets its own pending entries back without waiting for the
// lease.
func TestSameConsumerNameRecoversAtOnce(t *testing.T) {
	f := newFixture(t)
	f.publish(t, []sourcetest.Outgoing{{ID: "a", Body: []byte("1")}, {ID: "b", Body: []byte("2")}})
	cfg := f.cfg(time.Hour)
	s1 := f.newSource(t, cfg, "pod-0")
	first := fetchAll(t, s1, 2)
	_ = s1.Close()
	s2 := f.newSource(t, cfg, "pod-0")
	defer s2.Close()
	start := time.Now()
	again := fetchAll(t, s2, 2)
	if time.Since(start) > 5*time.Second {
		t.Errorf("recovery took %v", time.Since(start))
	}
	for i := range again {
		if again[i].NativeID != first[i].NativeID {
			t.Errorf("recovered %s, first delivery was %s", again[i].NativeID, first[i].NativeID)
		}
	}
	if err := s2.Ack(t.Context(), again); err != nil {
		t.Fatal(err)
	}
	if n, err := f.rdb.XPending(t.Context(), f.stream, f.group).Result(); err != nil || n.Count != 0 {
		t.Fatalf("pending after ack: %+v, %v", n, err)
	}
}

// TestFieldsAndIDTime checks a custom body field, headers and PublishedAt
// taken from the entry id.
func TestFieldsAndIDTime(t *testing.T) {
	f := newFixture(t)
	id, err := f.rdb.XAdd(t.Context(), &redis.XAddArgs{Stream: f.stream, ID: "1700000000123-0", Values: []any{"payload", `{"a":1}`, "type", "created", "n", 7}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	cfg := f.cfg(time.Minute)
	cfg.BodyField = "payload"
	s := f.newSource(t, cfg, "")
	defer s.Close()
	m := fetchAll(t, s, 1)[0]
	if m.NativeID != id || string(m.Body) != `{"a":1}` || m.Headers["type"] != "created" || m.Headers["n"] != "7" {
		t.Fatalf("unexpected message %+v (headers %v)", m, m.Headers)
	}
	if _, ok := m.Headers["payload"]; ok {
		t.Error("the body field is also a header")
	}
	if !m.PublishedAt.Equal(time.UnixMilli(1700000000123)) || m.Attempt != 1 {
		t.Errorf("PublishedAt %v Attempt %d", m.PublishedAt, m.Attempt)
	}
}

// TestDeletedPendingEntryIsDropped: an entry deleted from the stream while
// pending is acknowledged and not handed to the caller.
func TestDeletedPendingEntryIsDropped(t *testing.T) {
	f := newFixture(t)
	f.publish(t, []sourcetest.Outgoing{{ID: "a", Body: []byte("1")}, {ID: "b", Body: []byte("2")}})
	cfg := f.cfg(time.Hour)
	s1 := f.newSource(t, cfg, "pod-0")
	first := fetchAll(t, s1, 2)
	_ = s1.Close()
	if err := f.rdb.XDel(t.Context(), f.stream, first[0].NativeID).Err(); err != nil {
		t.Fatal(err)
	}
	s2 := f.newSource(t, cfg, "pod-0")
	defer s2.Close()
	got := fetchAll(t, s2, 1)
	if got[0].NativeID != first[1].NativeID {
		t.Fatalf("got %s, want %s", got[0].NativeID, first[1].NativeID)
	}
	if err := s2.Ack(t.Context(), got); err != nil {
		t.Fatal(err)
	}
	if n, err := f.rdb.XPending(t.Context(), f.stream, f.group).Result(); err != nil || n.Count != 0 {
		t.Fatalf("pending after ack: %+v, %v", n, err)
	}
}

func TestEmptyPasswordEnvIsAnError(t *testing.T) {
	t.Setenv("IDC_TEST_REDIS_PASSWORD", "")
	cfg := &config.RedisStreams{Address: redisAddr, Stream: "s", Group: "g", PasswordEnv: "IDC_TEST_REDIS_PASSWORD"}
	if s, err := New(t.Context(), cfg, testr.New(t), WithConsumerName("c")); err == nil {
		_ = s.Close()
		t.Fatal("New accepted an empty password variable")
	}
}

func TestNewFailsWithoutServer(t *testing.T) {
	cfg := &config.RedisStreams{Address: "127.0.0.1:1", Stream: "s", Group: "g"}
	if s, err := New(t.Context(), cfg, testr.New(t), WithConsumerName("c")); err == nil {
		_ = s.Close()
		t.Fatal("New succeeded against a closed port")
	}
}

// TestGroupRecreatedAfterLoss: when the group disappears (Redis restarted
// without persistence), Fetch reports the error once and recovers.
func TestGroupRecreatedAfterLoss(t *testing.T) {
	f := newFixture(t)
	s := f.newSource(t, f.cfg(time.Minute), "")
	defer s.Close()
	if err := f.rdb.XGroupDestroy(t.Context(), f.stream, f.group).Err(); err != nil {
		t.Fatal(err)
	}
	f.publish(t, []sourcetest.Outgoing{{ID: "a", Body: []byte("1")}})
	if _, err := s.Fetch(t.Context(), 10, 100*time.Millisecond); err == nil {
		t.Fatal("Fetch without the group succeeded")
	}
	got := fetchAll(t, s, 1)
	if got[0].Headers[sourcetest.IDHeader] != "a" {
		t.Fatalf("got %+v", got[0])
	}
}
