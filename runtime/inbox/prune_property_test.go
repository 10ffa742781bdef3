package inbox_test

// Safety properties of pruning, for both layouts, over seeded random data:
// nothing that may still be redelivered or replayed (younger than the
// window, database clock) is ever deleted, and everything entirely older
// than the cutoff is gone. Then: once an id is pruned, a late duplicate with
// an older sequence is refused by the upsert's sequence gate.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// propSeeds drive every property test; a failure names its seed.
var propSeeds = []uint64{1, 2, 3, 42, 1337, 20240601}

// propStore migrates a fresh inbox idc.inbox_orders in its own database.
func propStore(t *testing.T, layout config.Layout) (*inbox.Store, *pgxpool.Pool) {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	s, err := inbox.New(pool, config.Sink{Schema: "idc", InboxTable: "inbox_orders", Layout: layout})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, pool
}

func propRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x1dc0ffee)) }

// dbNow is the database clock, the one every cutoff is taken from.
func dbNow(t *testing.T, q inbox.Querier) time.Time {
	t.Helper()
	var now time.Time
	if err := q.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// tableRows reads message_id → processed_at of the whole inbox.
func tableRows(t *testing.T, pool *pgxpool.Pool) map[string]time.Time {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT message_id, processed_at FROM idc.inbox_orders")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Time{}
	var id string
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &at}, func() error { out[id] = at; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPruneTableSafetyProperty: rows scattered around now()-window, densely
// right at it and sparsely far from it (years old, in the future from a
// skewed clock); several prune rounds with random windows and batch sizes.
// After each round the survivors are exactly the rows with processed_at >=
// the run's cutoff.
func TestPruneTableSafetyProperty(t *testing.T) {
	for _, seed := range propSeeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			ctx := context.Background()
			rng := propRNG(seed)
			s, pool := propStore(t, config.LayoutTable)
			window := time.Duration(1+rng.IntN(14*24))*time.Hour + time.Duration(rng.IntN(3600))*time.Second

			// Offsets (µs) from now()-window at insert time. Negative is older.
			n := 400 + rng.IntN(400)
			ids := make([]string, n)
			offs := make([]int64, n)
			for i := range n {
				ids[i] = fmt.Sprintf("id-%d-%d", seed, i)
				var off time.Duration
				switch rng.IntN(5) {
				case 0, 1: // right at the cutoff: the prune's own cutoff lands in here
					off = time.Duration(rng.Int64N(int64(4*time.Second))) - time.Second
				case 2: // within two hours either side
					off = time.Duration(rng.Int64N(int64(4*time.Hour))) - 2*time.Hour
				case 3: // anywhere from 2 windows old to brand new
					off = time.Duration(rng.Int64N(int64(2*window))) - window
				default: // extremes: years old, or up to a day in the future
					if rng.IntN(2) == 0 {
						off = -time.Duration(rng.Int64N(int64(5 * 365 * 24 * time.Hour)))
					} else {
						off = window + time.Duration(rng.Int64N(int64(24*time.Hour)))
					}
				}
				offs[i] = off.Microseconds()
			}
			if _, err := pool.Exec(ctx, `INSERT INTO idc.inbox_orders (message_id, processed_at)
				SELECT u.id, now() - $1::bigint * interval '1 microsecond' + u.off * interval '1 microsecond'
				FROM unnest($2::text[], $3::bigint[]) AS u(id, off)`, window.Microseconds(), ids, offs); err != nil {
				t.Fatal(err)
			}
			live := tableRows(t, pool)
			if len(live) != n {
				t.Fatalf("inserted %d rows, want %d", len(live), n)
			}

			for round := range 3 {
				// Windows move both ways between rounds (a grown window, a
				// shrunk one adopted later): the property holds for any.
				w := window + time.Duration(rng.Int64N(int64(20*time.Minute))) - 10*time.Minute
				if round == 0 {
					w = window
				}
				batch := 1 + rng.IntN(64)
				before := dbNow(t, pool)
				res, err := s.PruneTable(ctx, inbox.Bound{Window: w}, batch, 5*time.Minute)
				after := dbNow(t, pool)
				if err != nil {
					t.Fatalf("round %d: PruneTable: %v", round, err)
				}
				// The cutoff is the database's now()-window, taken during the run.
				if res.Cutoff.Before(before.Add(-w)) || res.Cutoff.After(after.Add(-w)) {
					t.Fatalf("round %d: cutoff %s outside [%s, %s] (db clock - window)", round, res.Cutoff, before.Add(-w), after.Add(-w))
				}
				got := tableRows(t, pool)
				var wantDeleted int64
				nearOlder, nearYounger := 0, 0
				for id, at := range live {
					older := at.Before(res.Cutoff)
					_, kept := got[id]
					switch {
					case older && kept:
						t.Errorf("round %d: row %s processed at %s is older than cutoff %s and survived", round, id, at, res.Cutoff)
					case !older && !kept:
						t.Errorf("round %d: row %s processed at %s is not older than cutoff %s (window %s) but was deleted", round, id, at, res.Cutoff, w)
					}
					if older {
						wantDeleted++
					}
					if d := at.Sub(res.Cutoff); d >= -time.Second && d < 0 {
						nearOlder++
					} else if d >= 0 && d <= time.Second {
						nearYounger++
					}
				}
				for id := range got {
					if _, ok := live[id]; !ok {
						t.Errorf("round %d: row %s appeared from nowhere", round, id)
					}
				}
				if res.RowsDeleted != wantDeleted {
					t.Errorf("round %d: RowsDeleted = %d, want %d", round, res.RowsDeleted, wantDeleted)
				}
				run, err := s.LastPruneRun(ctx)
				if err != nil || run == nil || run.RowsDeleted != res.RowsDeleted || !run.Cutoff.Equal(res.Cutoff) || run.Error != "" || run.FinishedAt == nil {
					t.Errorf("round %d: LastPruneRun = %+v, %v; result %+v", round, run, err, res)
				}
				t.Logf("round %d: window %s batch %d deleted %d kept %d (within 1s of the cutoff: %d older, %d younger)",
					round, w, batch, res.RowsDeleted, len(got), nearOlder, nearYounger)
				live = got
			}
		})
	}
}
