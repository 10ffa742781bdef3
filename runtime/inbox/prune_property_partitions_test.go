package inbox_test

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// partitionRE matches the day partitions the store creates.
var partitionRE = regexp.MustCompile(`^inbox_orders_p(\d{8})$`)

// partitionsOf lists the partitions of idc.inbox_orders: day partitions by
// day, and every partition name.
func partitionsOf(t *testing.T, pool *pgxpool.Pool) (map[time.Time]string, map[string]bool) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'idc.inbox_orders'::regclass`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	days, all := map[time.Time]string{}, map[string]bool{}
	for _, n := range names {
		all[n] = true
		if m := partitionRE.FindStringSubmatch(n); m != nil {
			d, err := time.Parse("20060102", m[1])
			if err != nil {
				t.Fatal(err)
			}
			days[d] = n
		}
	}
	return days, all
}

func partitionedRows(t *testing.T, pool *pgxpool.Pool) map[string]time.Time {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT message_id, published_on FROM idc.inbox_orders")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]time.Time{}
	var id string
	var day time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &day}, func() error { out[id] = day; return nil })
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPrunePartitionsSafetyProperty: rows on random publish days around the
// cutoff; windows either random or placed so the cutoff falls within two
// seconds of a midnight (the partition boundary). A partition is dropped iff
// its whole range [day, day+1) ends at or before the cutoff; a row survives
// iff its day ends after the cutoff (it may have been published after it).
// A partition attached by hand under another name is never touched.
func TestPrunePartitionsSafetyProperty(t *testing.T) {
	for _, seed := range propSeeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			ctx := context.Background()
			rng := propRNG(seed)
			s, pool := propStore(t, config.LayoutPartitioned)
			now := dbNow(t, pool)
			today := inbox.Day(now)
			windowDays := 1 + rng.IntN(8)
			span := windowDays + 8
			first := today.AddDate(0, 0, -(windowDays + 5))
			if err := s.EnsurePartitions(ctx, first, span); err != nil {
				t.Fatal(err)
			}
			pgtest.Exec(t, pool,
				`CREATE TABLE idc.inbox_orders_legacy PARTITION OF idc.inbox_orders FOR VALUES FROM ('2000-01-01') TO ('2000-02-01')`,
				`INSERT INTO idc.inbox_orders (message_id, published_on) VALUES ('legacy-1', '2000-01-15')`)

			// Each row was processed some time during its publish day (never
			// after now): no late first delivery here, so publish day and
			// processing agree on which side of the cutoff a row is.
			n := 300 + rng.IntN(300)
			ids := make([]string, n)
			days := make([]pgtype.Date, n)
			offs := make([]int64, n)
			for i := range n {
				ids[i] = fmt.Sprintf("p-%d-%d", seed, i)
				days[i] = pgtype.Date{Time: first.AddDate(0, 0, rng.IntN(span)), Valid: true}
				offs[i] = rng.Int64N(int64(24 * time.Hour / time.Microsecond))
			}
			if _, err := pool.Exec(ctx, `INSERT INTO idc.inbox_orders (message_id, published_on, processed_at)
				SELECT u.id, u.day, least(u.day::timestamp AT TIME ZONE 'UTC' + u.off * interval '1 microsecond', now())
				FROM unnest($1::text[], $2::date[], $3::bigint[]) AS u(id, day, off)`, ids, days, offs); err != nil {
				t.Fatal(err)
			}
			live := partitionedRows(t, pool)

			for round := range 2 {
				var w time.Duration
				if rng.IntN(2) == 0 {
					w = time.Duration(windowDays)*24*time.Hour + time.Duration(rng.Int64N(int64(24*time.Hour)))
				} else {
					// cutoff = now - w lands within ±2s of midnight of day -k.
					midnight := inbox.Day(dbNow(t, pool)).AddDate(0, 0, -(windowDays - round))
					delta := time.Duration(rng.Int64N(int64(4*time.Second))) - 2*time.Second
					w = dbNow(t, pool).Sub(midnight) - delta
				}
				partsBefore, _ := partitionsOf(t, pool)
				before := dbNow(t, pool)
				res, err := s.PrunePartitions(ctx, inbox.Bound{Window: w})
				after := dbNow(t, pool)
				if err != nil {
					t.Fatalf("round %d: PrunePartitions: %v", round, err)
				}
				if res.Cutoff.Before(before.Add(-w)) || res.Cutoff.After(after.Add(-w)) {
					t.Fatalf("round %d: cutoff %s outside [%s, %s]", round, res.Cutoff, before.Add(-w), after.Add(-w))
				}
				partsAfter, all := partitionsOf(t, pool)
				wantDropped := 0
				for day, name := range partsBefore {
					entirelyOlder := !day.AddDate(0, 0, 1).After(res.Cutoff)
					_, kept := partsAfter[day]
					switch {
					case entirelyOlder && kept:
						t.Errorf("round %d: partition %s ends %s, not after cutoff %s, and was kept", round, name, day.AddDate(0, 0, 1), res.Cutoff)
					case !entirelyOlder && !kept:
						t.Errorf("round %d: partition %s may hold rows younger than cutoff %s (window %s) and was dropped", round, name, res.Cutoff, w)
					}
					if entirelyOlder {
						wantDropped++
					}
				}
				if res.PartitionsDropped != wantDropped {
					t.Errorf("round %d: PartitionsDropped = %d, want %d", round, res.PartitionsDropped, wantDropped)
				}
				if !all["inbox_orders_legacy"] {
					t.Errorf("round %d: the hand-attached partition was dropped", round)
				}
				got := partitionedRows(t, pool)
				for id, day := range live {
					_, kept := got[id]
					if id == "legacy-1" {
						if !kept {
							t.Errorf("round %d: the hand-attached partition's row is gone", round)
						}
						continue
					}
					mayBeYounger := day.AddDate(0, 0, 1).After(res.Cutoff)
					switch {
					case mayBeYounger && !kept:
						t.Errorf("round %d: row %s published on %s may be younger than cutoff %s and was deleted", round, id, day.Format(time.DateOnly), res.Cutoff)
					case !mayBeYounger && kept:
						t.Errorf("round %d: row %s published on %s is entirely older than cutoff %s and survived", round, id, day.Format(time.DateOnly), res.Cutoff)
					}
				}
				if len(got) > len(live) {
					t.Errorf("round %d: %d rows after pruning, %d before", round, len(got), len(live))
				}
				run, err := s.LastPruneRun(ctx)
				if err != nil || run == nil || run.PartitionsDropped != res.PartitionsDropped || !run.Cutoff.Equal(res.Cutoff) || run.Error != "" {
					t.Errorf("round %d: LastPruneRun = %+v, %v; result %+v", round, run, err, res)
				}
				t.Logf("round %d: window %s cutoff %s dropped %d partitions, %d rows kept of %d",
					round, w, res.Cutoff.UTC().Format(time.RFC3339Nano), res.PartitionsDropped, len(got), len(live))
				live = got
			}
		})
	}
}
