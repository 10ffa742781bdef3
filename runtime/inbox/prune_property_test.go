package inbox_test

// Safety properties of pruning, for both layouts, over seeded random data:
// nothing that may still be redelivered or replayed (younger than the
// window, database clock) is ever deleted, and everything entirely older
// than the cutoff is gone. Then: once an id is pruned, a late duplicate with
// an older sequence is refused by the upsert's sequence gate.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/source"
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

// gateMessage is one version of one order, with a message id and a publish
// time that stay the same on every redelivery.
type gateMessage struct {
	id        string
	order     int
	version   int
	published time.Time
}

func (g gateMessage) record() *extract.Message {
	body, _ := json.Marshal(map[string]any{"orderId": fmt.Sprintf("o%d", g.order), "status": fmt.Sprintf("v%d", g.version), "version": g.version})
	m := extract.NewMessage(source.Message{NativeID: "n-" + g.id, Body: body, PublishedAt: g.published})
	m.ID = g.id
	return m
}

// deliver runs recs through the consumer's transaction shape: partitions
// ensured first, then one READ COMMITTED transaction that claims the ids and
// applies the effect to the new ones only.
func deliver(t *testing.T, s *inbox.Store, pool *pgxpool.Pool, eff effect.Effect, recs []*extract.Message) (fresh int, res effect.Result) {
	t.Helper()
	ctx := context.Background()
	times := make([]time.Time, len(recs))
	claims := make([]inbox.Claim, len(recs))
	for i, m := range recs {
		times[i] = m.PublishedAt
		claims[i] = inbox.Claim{MessageID: m.ID, PublishedAt: m.PublishedAt}
	}
	if err := s.EnsurePartitionsFor(ctx, times); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	got, err := s.Claim(ctx, tx, claims)
	if err != nil {
		t.Fatal(err)
	}
	var newRecs []*extract.Message
	for _, m := range recs {
		if _, ok := got[m.ID]; ok {
			newRecs = append(newRecs, m)
		}
	}
	res, err = eff.Apply(ctx, tx, newRecs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed) != 0 {
		t.Fatalf("effect failures: %+v", res.Failed)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return len(newRecs), res
}

func orderState(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT order_id, status || '/' || version FROM app.orders")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var k, v string
	if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = v; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPrunedIDsLateOlderSequenceDoesNotRegress: every version of every order
// is processed, the inbox rows age past the window and are pruned, then the
// broker redelivers old versions under their original ids and publish times
// (a replay, or a redelivery the window did not cover). The inbox no longer
// knows the ids, so they are claimed as new; the sequence gate refuses every
// one of them (counted stale) and the state does not move back. One genuinely
// newer version in the same redelivery still applies.
func TestPrunedIDsLateOlderSequenceDoesNotRegress(t *testing.T) {
	for _, layout := range []config.Layout{config.LayoutTable, config.LayoutPartitioned} {
		for _, seed := range propSeeds[:3] {
			t.Run(fmt.Sprintf("%s/seed=%d", layout, seed), func(t *testing.T) {
				ctx := context.Background()
				rng := propRNG(seed)
				s, pool := propStore(t, layout)
				pgtest.Exec(t, pool, "CREATE SCHEMA app",
					"CREATE TABLE app.orders (order_id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)")
				eff, err := effect.New(config.Effect{Upsert: &config.Upsert{
					Table: "orders", Key: []string{"order_id"}, SequenceColumn: "version",
					Columns: map[string]string{"order_id": "$.orderId", "status": "$.status", "version": "$.version"},
				}}, "app", nil)
				if err != nil {
					t.Fatal(err)
				}
				const window = 72 * time.Hour
				// Published ten days ago (older than the window on either clock).
				base := time.Now().Add(-10 * 24 * time.Hour)
				orders, versions := 6+rng.IntN(6), 3+rng.IntN(5)
				var msgs []gateMessage
				for o := range orders {
					for v := 1; v <= versions; v++ {
						msgs = append(msgs, gateMessage{
							id: fmt.Sprintf("m-o%d-v%d", o, v), order: o, version: v,
							published: base.Add(time.Duration(rng.IntN(3600)) * time.Second),
						})
					}
				}
				recsOf := func(ms []gateMessage) []*extract.Message {
					out := make([]*extract.Message, len(ms))
					for i, g := range ms {
						out[i] = g.record()
					}
					return out
				}
				// First delivery, shuffled, in random batches.
				rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
				for start := 0; start < len(msgs); {
					end := min(len(msgs), start+1+rng.IntN(7))
					deliver(t, s, pool, eff, recsOf(msgs[start:end]))
					start = end
				}
				settled := orderState(t, pool)
				for o := range orders {
					if want := fmt.Sprintf("v%d/%d", versions, versions); settled[fmt.Sprintf("o%d", o)] != want {
						t.Fatalf("o%d settled at %s, want %s", o, settled[fmt.Sprintf("o%d", o)], want)
					}
				}

				// Age the inbox rows (processed when published, ten days ago)
				// and prune them.
				pgtest.Exec(t, pool, "UPDATE idc.inbox_orders SET processed_at = now() - interval '10 days'")
				var res inbox.PruneResult
				if layout == config.LayoutTable {
					res, err = s.PruneTable(ctx, inbox.Bound{Window: window}, 1+rng.IntN(10), time.Minute)
				} else {
					if err = s.EnsurePartitions(ctx, time.Now(), 2); err != nil {
						t.Fatal(err)
					}
					res, err = s.PrunePartitions(ctx, inbox.Bound{Window: window})
				}
				if err != nil {
					t.Fatal(err)
				}
				allIDs := make([]string, len(msgs))
				for i, g := range msgs {
					allIDs[i] = g.id
				}
				known, err := s.Existing(ctx, pool, allIDs)
				if err != nil {
					t.Fatal(err)
				}
				if len(known) != 0 || (res.RowsDeleted == 0 && res.PartitionsDropped == 0) {
					t.Fatalf("after pruning %d ids are still in the inbox (result %+v); want none", len(known), res)
				}

				// Redelivery: every non-latest version, some latest ones again,
				// and one new version of order 0, shuffled, in random batches.
				var redo []gateMessage
				for _, g := range msgs {
					if g.version < versions || rng.IntN(2) == 0 {
						redo = append(redo, g)
					}
				}
				newer := gateMessage{id: "m-o0-new", order: 0, version: versions + 1, published: time.Now()}
				redo = append(redo, newer)
				rng.Shuffle(len(redo), func(i, j int) { redo[i], redo[j] = redo[j], redo[i] })
				var fresh, applied, stale int
				for start := 0; start < len(redo); {
					end := min(len(redo), start+1+rng.IntN(7))
					f, r := deliver(t, s, pool, eff, recsOf(redo[start:end]))
					fresh, applied, stale = fresh+f, applied+r.Applied, stale+r.Stale
					start = end
				}
				if fresh != len(redo) {
					t.Errorf("%d of %d redelivered ids claimed as new; pruned ids must be new to the inbox", fresh, len(redo))
				}
				if applied != 1 || stale != len(redo)-1 {
					t.Errorf("redelivery applied %d, stale %d; want 1 applied (the newer version), %d stale", applied, stale, len(redo)-1)
				}
				final := orderState(t, pool)
				for o := range orders {
					key, want := fmt.Sprintf("o%d", o), settled[fmt.Sprintf("o%d", o)]
					if o == 0 {
						want = fmt.Sprintf("v%d/%d", versions+1, versions+1)
					}
					if final[key] != want {
						t.Errorf("%s is at %s after the late redelivery, want %s", key, final[key], want)
					}
				}
				t.Logf("%d orders x %d versions; redelivered %d after pruning: %d applied, %d stale", orders, versions, len(redo), applied, stale)
			})
		}
	}
}
