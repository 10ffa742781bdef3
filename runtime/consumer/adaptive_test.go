package consumer

import (
	"fmt"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// idleWait is a maxWait no test outlives: the loop must not wait for it.
const idleWait = time.Hour

// waitAcked waits until the fake broker saw n distinct messages
// acknowledged. The bound only turns a hang into a failure.
func waitAcked(t *testing.T, src *fakeSource, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		src.mu.Lock()
		got := len(src.acked)
		src.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages acknowledged: the loop waits for a batch that is not coming (maxWait %s)", got, n, idleWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func numbered(n int) []source.Message {
	msgs := make([]source.Message, n)
	for i := range msgs {
		msgs[i] = message(fmt.Sprintf("n%05d", i), fmt.Sprintf(`{"id":"id-%d","n":%d}`, i, i))
	}
	return msgs
}

// A fetch that returns less than a batch is committed and acknowledged at
// once: nothing in the loop (lanes, the queue a lane merges) waits for
// more, with maxWait an hour and the broker silent after three messages.
func TestLoopCommitsAPartialBatchAtOnce(t *testing.T) {
	cfg := testConfig(t, config.LayoutTable)
	cfg.Delivery.BatchSize = 500
	cfg.Delivery.MaxWait.Duration = idleWait
	pool, _ := setup(t, cfg)
	src := newFakeSource(numbered(3))
	start(t, src, pool, cfg, newMetrics(t))
	waitAcked(t, src, 3)
	assertExactlyOnce(t, pool, 3)
}

// Under backlog every transaction is a whole batch: 1,000 waiting messages
// in batches of 100 on one lane commit in 10 transactions (one Ack each),
// not in more, smaller ones.
func TestLoopFillsEveryBatchUnderBacklog(t *testing.T) {
	cfg := testConfig(t, config.LayoutTable)
	cfg.Delivery.BatchSize = 100
	cfg.Delivery.InFlight = 1
	cfg.Delivery.MaxWait.Duration = idleWait
	pool, _ := setup(t, cfg)
	src := newFakeSource(numbered(1000))
	start(t, src, pool, cfg, newMetrics(t))
	waitAcked(t, src, 1000)
	assertExactlyOnce(t, pool, 1000)
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.acks != 10 {
		t.Fatalf("1,000 messages in batches of 100 were committed in %d transactions, want 10", src.acks)
	}
}

// A fetch that fits one transaction, taken while no lane is busy, is
// committed whole by one lane: six messages whose ids hash to both of two
// lanes are one transaction (one Ack), not one per lane.
func TestIdleFetchIsCommittedWhole(t *testing.T) {
	cfg := testConfig(t, config.LayoutTable)
	cfg.Delivery.BatchSize = 500
	cfg.Delivery.InFlight = 2
	cfg.Delivery.MaxWait.Duration = idleWait
	pool, _ := setup(t, cfg)
	msgs := numbered(6)
	lanes := map[int]bool{}
	for i := range msgs {
		lanes[laneOf(fmt.Sprintf("id-%d", i), 2)] = true
	}
	if len(lanes) != 2 {
		t.Fatalf("the test's ids all hash to one lane (%v): pick others", lanes)
	}
	src := newFakeSource(msgs)
	start(t, src, pool, cfg, newMetrics(t))
	waitAcked(t, src, 6)
	assertExactlyOnce(t, pool, 6)
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.acks != 1 {
		t.Fatalf("6 messages fetched at once on 2 idle lanes were committed in %d transactions, want 1", src.acks)
	}
}
