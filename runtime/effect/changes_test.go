package effect

import (
	"fmt"
	"slices"
	"testing"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// With TrackChanges an upsert lists exactly the records it wrote: not the
// ones the gate refused against stored state, not the ones superseded by a
// newer version of their key in the same batch, not the failed ones. The
// stored state is the same as without tracking.
func TestUpsertTrackChanges(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, "CREATE SCHEMA s", ordersDDL,
		`INSERT INTO s.orders VALUES ('stored', 'v7', 7)`)
	e, err := New(upsertConfig("version"), "s", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !TrackChanges(e) {
		t.Fatal("an upsert must report its changes")
	}
	body := func(key string, v int) string {
		return fmt.Sprintf(`{"orderId":%q,"status":"v%d","version":%d}`, key, v, v)
	}
	recs := []*Record{
		rec("a1", body("a", 1)),         // 0: superseded by a2 in the batch
		rec("a2", body("a", 2)),         // 1: written
		rec("stale", body("stored", 5)), // 2: refused by the gate (7 stored)
		rec("newer", body("stored", 9)), // 3: written
		rec("bad", `{"orderId":"x"}`),   // 4: fails (no version)
		rec("b1", body("b", 1)),         // 5: written
	}
	res := apply(t, pool, e, recs)
	if want := []int{1, 3, 5}; !slices.Equal(res.Changed, want) {
		t.Errorf("Changed = %v, want %v", res.Changed, want)
	}
	if res.Applied != 3 || res.Stale != 2 || len(res.Failed) != 1 || res.Failed[0].Index != 4 {
		t.Errorf("applied %d stale %d failed %+v; want 3, 2 and record 4", res.Applied, res.Stale, res.Failed)
	}
	var v int
	if err := pool.QueryRow(t.Context(), "SELECT version FROM s.orders WHERE order_id = 'stored'").Scan(&v); err != nil || v != 9 {
		t.Errorf("stored version %d (%v), want 9", v, err)
	}
	// The same batch again changes nothing.
	if res := apply(t, pool, e, recs[:4]); len(res.Changed) != 0 || res.Applied != 0 {
		t.Errorf("replayed batch: Changed %v applied %d, want none", res.Changed, res.Applied)
	}
}

func TestTrackChangesOnlyForUpsert(t *testing.T) {
	e, err := New(config.Effect{Append: &config.Append{Table: "events", Columns: map[string]string{"message_id": "@messageId"}}}, "s", nil)
	if err != nil {
		t.Fatal(err)
	}
	if TrackChanges(e) {
		t.Error("append changes state with every applied record; it must not report tracked changes")
	}
}
