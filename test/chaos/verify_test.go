package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, ^seed)) }

var consumers = []string{"append", "upsert"}

// settleWatch decides when everything published is settled: both durable
// consumers have nothing undelivered and nothing unacknowledged, and the
// replicas' idc_messages_total (counted after each ack) has stopped moving,
// so none is in the middle of a batch.
type settleWatch struct {
	s      *stream
	reps   []*replica
	last   float64
	stable int
}

// stablePolls is how many consecutive quiet polls count as settled.
const stablePolls = 3

func (w *settleWatch) settled(ctx context.Context) (bool, error) {
	for _, c := range consumers {
		pending, ackPending, err := w.s.outstanding(ctx, c)
		if err != nil {
			return false, err
		}
		if pending+uint64(ackPending) > 0 {
			w.stable = 0
			return false, nil
		}
	}
	sum := 0.0
	for _, r := range w.reps {
		v, err := r.cur.counter(ctx, "idc_messages_total")
		if err != nil {
			w.stable = 0 // a replica still starting
			return false, nil
		}
		sum += v
	}
	if sum != w.last {
		w.last, w.stable = sum, 0
		return false, nil
	}
	w.stable++
	return w.stable >= stablePolls, nil
}

func (w *settleWatch) describe(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var parts []string
	for _, c := range consumers {
		pending, ackPending, err := w.s.outstanding(ctx, c)
		parts = append(parts, fmt.Sprintf("%s: pending %d, ack pending %d, err %v", c, pending, ackPending, err))
	}
	return strings.Join(parts, "; ")
}

func reportUnexpected(t *testing.T, st chaosStats) {
	t.Helper()
	for _, u := range st.unexpected {
		t.Errorf("unexpected exit: %s", u)
	}
}

// checkBroker: JetStream stored every publication (no duplicate window
// swallowed a re-sent copy) and, after the graceful stop, both consumers
// still have nothing outstanding.
func checkBroker(t *testing.T, s *stream, pub *publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stored, err := s.stored(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sent := uint64(pub.sent.Load())
	if stored < sent || pub.dupAcks > 0 {
		t.Errorf("the stream stored %d messages for %d acknowledged publications (%d PubAcks flagged duplicate): JetStream deduplicated some",
			stored, sent, pub.dupAcks)
	}
	if stored > sent {
		t.Logf("the stream stored %d messages for %d acknowledged publications: producer retries", stored, sent)
	}
	for _, c := range consumers {
		pending, ackPending, err := s.outstanding(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if pending != 0 || ackPending != 0 {
			t.Errorf("after the graceful stop, consumer %s has %d undelivered and %d unacknowledged messages", c, pending, ackPending)
		}
	}
}

func checkDatabase(t *testing.T, db sinkDB, pub *publisher) verdict {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	v, err := db.check(ctx, pub.published())
	if err != nil {
		t.Fatalf("checking the database: %v", err)
	}
	return v
}

// logRuntimeEvidence shows, from the replicas' logs, that the faults hit
// work in flight, and how the runtime coped.
func logRuntimeEvidence(t *testing.T, f *fleet) {
	t.Helper()
	msgs := []string{
		"CHAOS FAILPOINT ARMED", "Database unavailable; retrying the batch", "Batch failed; retrying",
		"Dead-lettering", "Ack failed after commit", "Fetch failed", "Startup step failed",
	}
	counts := f.logCounts(msgs...)
	parts := make([]string, 0, len(msgs))
	for _, m := range msgs {
		parts = append(parts, fmt.Sprintf("%q=%d", m, counts[m]))
	}
	t.Logf("runtime log lines: %s", strings.Join(parts, ", "))
}

func judge(t *testing.T, sz size, st chaosStats, v verdict) {
	t.Helper()
	if v.doubled != 0 || v.lost != 0 || v.stale != 0 {
		t.Errorf("exactly-once violated: doubled=%d lost=%d stale=%d (of which %d backward row changes)",
			v.doubled, v.lost, v.stale, v.backwards)
	}
	if v.applied+v.deadLetters < v.unique {
		t.Errorf("applied %d + dead letters %d < %d unique ids", v.applied, v.deadLetters, v.unique)
	}
	if v.phantom != 0 {
		t.Errorf("%d effect or inbox rows for ids that were never published", v.phantom)
	}
	if v.deadLetters != 0 {
		t.Errorf("%d dead letters: every published message is well-formed, so a fault was taken for a poison message", v.deadLetters)
	}
	if st.kills() < sz.minKills || st.failpointKills < sz.minFailpoint || st.cuts < sz.minCuts {
		t.Errorf("not enough chaos for the %s form: %s; want kills >= %d (failpoint >= %d), cuts >= %d",
			sz.name, st, sz.minKills, sz.minFailpoint, sz.minCuts)
	}
}
