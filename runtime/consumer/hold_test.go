package consumer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// A misconfigured sink holds the loop: the batch in flight is neither acked
// nor dead-lettered, nothing more is fetched, readiness says why and the
// gauge is 1; once the schema is fixed the loop goes on by itself and every
// message is applied exactly once. The unit-level companion of
// test/integration/sinkerrors_test.go (which runs the real binary).
func TestMisconfiguredSinkHoldsUntilFixed(t *testing.T) {
	for _, tc := range []struct {
		name, reason string
		breakSQL     []string
		fixSQL       []string
	}{
		{"missing table", SinkUndefinedTable,
			[]string{"DROP TABLE app.effects"},
			[]string{"CREATE TABLE app.effects (seq bigserial, message_id text NOT NULL, n int CHECK (n >= 0))"}},
		{"missing column", SinkUndefinedColumn,
			[]string{"ALTER TABLE app.effects DROP COLUMN n"},
			[]string{"ALTER TABLE app.effects ADD COLUMN n int"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, config.LayoutTable)
			cfg.Delivery.MaxAttempts = 1 // were a sink error ever counted, the batch would dead-letter at once
			cfg.Delivery.InFlight = 4    // the hold must stop every lane, and the fetcher
			pool, _ := setup(t, cfg)
			pgtest.Exec(t, pool, tc.breakSQL...)
			const total = 300
			src := newFakeSource(withDuplicates(total, total))
			m := newMetrics(t)
			r := start(t, src, pool, cfg, m)

			deadline := time.Now().Add(30 * time.Second)
			for {
				if _, held := r.c.Held(); held {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the loop never held on the misconfigured sink")
				}
				time.Sleep(10 * time.Millisecond)
			}
			src.mu.Lock()
			fetchesAtHold := src.fetches
			src.mu.Unlock()
			// Give the wrong behaviour (fetching, acking, dead-lettering)
			// many backoff steps to show itself: wait until the held batch
			// was retried holdSteps times (MaxAttempts is 1), or the hold
			// ended (the checks below say how).
			const holdSteps = 8
			for deadline := time.Now().Add(30 * time.Second); r.c.holdLogged.Load() < holdSteps; time.Sleep(5 * time.Millisecond) {
				if _, held := r.c.Held(); !held {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the hold reached step %d in 30 s, want %d", r.c.holdLogged.Load(), holdSteps)
				}
			}

			reason, held := r.c.Held()
			if !held || reason != tc.reason {
				t.Fatalf("Held() = %q, %v; want %q, true", reason, held, tc.reason)
			}
			err := r.c.Readiness()
			if !errors.Is(err, ErrSinkMisconfigured) || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Readiness() = %v, want the sink-misconfigured reason %q", err, tc.reason)
			}
			if got := testutil.ToFloat64(m.SinkMisconfigured.WithLabelValues(tc.reason)); got != 1 {
				t.Errorf("idc_sink_misconfigured{reason=%q} = %v, want 1", tc.reason, got)
			}
			src.mu.Lock()
			acked, fetches := len(src.acked), src.fetches
			src.mu.Unlock()
			if acked != 0 || fetches != fetchesAtHold {
				t.Errorf("while held: %d acked, %d fetches after the hold began; want 0 and 0", acked, fetches-fetchesAtHold)
			}
			var dead int
			if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM app.inbox_orders_dead_letters").Scan(&dead); err != nil || dead != 0 {
				t.Errorf("while held: %d dead letters (%v), want 0", dead, err)
			}

			pgtest.Exec(t, pool, tc.fixSQL...)
			waitSettled(t, src, total, time.Minute)
			r.stop(t)
			assertExactlyOnce(t, pool, total)
			if _, held := r.c.Held(); held || !r.c.Ready() {
				t.Errorf("after the fix: held %v, ready %v; want not held and ready", held, r.c.Ready())
			}
			if got := testutil.ToFloat64(m.SinkMisconfigured.WithLabelValues(tc.reason)); got != 0 {
				t.Errorf("after the fix: idc_sink_misconfigured{reason=%q} = %v, want 0", tc.reason, got)
			}
			if deadLettersTotal(t, m) != 0 {
				t.Error("a message was dead-lettered for the sink's fault")
			}
		})
	}
}
