package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// TestIDConflicts: the same id with two different payloads (a producer
// reusing an id) gives one effect, idc_id_conflicts_total 1, and what
// message.id.onPayloadMismatch says: a row in <inbox>_id_conflicts
// (Record), a dead letter (DeadLetter), nothing more (Ignore). A re-send of
// the same payload is a plain duplicate.
func TestIDConflicts(t *testing.T) {
	cases := []struct {
		policy             string
		layout             config.Layout
		conflictRows, dead int
	}{
		{config.PayloadMismatchRecord, config.LayoutTable, 1, 0},
		{config.PayloadMismatchRecord, config.LayoutPartitioned, 1, 0},
		{config.PayloadMismatchDeadLetter, config.LayoutTable, 0, 1},
		{config.PayloadMismatchIgnore, config.LayoutTable, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.policy+"/"+string(tc.layout), func(t *testing.T) {
			cfg := testConfig(t, tc.layout)
			cfg.Message.OnPayloadMismatch = tc.policy
			cfg.Delivery.BatchSize = 1 // the second payload meets the inbox, not the same batch
			pool, _ := setup(t, cfg)
			now := time.Now()
			msgs := []source.Message{
				{NativeID: "n1", Body: []byte(`{"id":"a","n":1}`), PublishedAt: now},
				{NativeID: "n2", Body: []byte(`{"id":"a","n":2}`), PublishedAt: now},
				{NativeID: "n3", Body: []byte(`{"id":"a","n":1}`), PublishedAt: now},
				{NativeID: "n4", Body: []byte(`{"id":"b","n":3}`), PublishedAt: now},
			}
			src := newFakeSource(msgs)
			m := newMetrics(t)
			r := start(t, src, pool, cfg, m)
			waitSettled(t, src, len(msgs), 30*time.Second)
			r.stop(t)

			assertExactlyOnce(t, pool, 2)
			var n int
			if err := pool.QueryRow(context.Background(), "SELECT n FROM app.effects WHERE message_id = 'a'").Scan(&n); err != nil || n != 1 {
				t.Fatalf("effect of id a: n = %d, %v; want the first payload's 1", n, err)
			}
			if got := testutil.ToFloat64(m.IDConflicts); got != 1 {
				t.Errorf("idc_id_conflicts_total = %v, want 1 (the re-send of the same payload is no conflict)", got)
			}
			var rows, dead int
			q := `SELECT (SELECT count(*) FROM app.inbox_orders_id_conflicts WHERE message_id = 'a' AND native_id = 'n2'),
				(SELECT count(*) FROM app.inbox_orders_dead_letters WHERE native_id = 'n2' AND reason LIKE 'id conflict: %')`
			if err := pool.QueryRow(context.Background(), q).Scan(&rows, &dead); err != nil {
				t.Fatal(err)
			}
			if rows != tc.conflictRows || dead != tc.dead {
				t.Errorf("%d conflict rows and %d dead letters, want %d and %d", rows, dead, tc.conflictRows, tc.dead)
			}
			if got := testutil.ToFloat64(m.DeadLetters.WithLabelValues(ReasonIDConflict)); got != float64(tc.dead) {
				t.Errorf("idc_dead_letters_total{reason=id_conflict} = %v, want %d", got, tc.dead)
			}
			if got := testutil.ToFloat64(m.DuplicatesSkipped); got != 2 {
				t.Errorf("idc_duplicates_skipped_total = %v, want 2", got)
			}
		})
	}
}
