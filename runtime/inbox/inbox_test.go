package inbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

var layouts = []config.Layout{config.LayoutTable, config.LayoutPartitioned}

func newStore(t *testing.T, pool *pgxpool.Pool, layout config.Layout, opts ...Option) *Store {
	t.Helper()
	s, err := New(pool, config.Sink{Schema: "idc", InboxTable: "inbox_orders", Layout: layout}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func migrated(t *testing.T, layout config.Layout) (*Store, *pgxpool.Pool) {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	s := newStore(t, pool, layout)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsurePartitions(context.Background(), time.Now().AddDate(0, 0, -3), 6); err != nil {
		t.Fatal(err)
	}
	return s, pool
}

func claim(t *testing.T, s *Store, pool *pgxpool.Pool, claims ...Claim) map[string]struct{} {
	t.Helper()
	got, err := claimTx(s, pool, claims)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func claimTx(s *Store, pool *pgxpool.Pool, claims []Claim) (got map[string]struct{}, err error) {
	ctx := context.Background()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		got, err = s.Claim(ctx, tx, claims)
		return err
	})
	return got, err
}

func ids(claims ...string) []Claim {
	out := make([]Claim, len(claims))
	for i, id := range claims {
		out[i] = Claim{MessageID: id, PublishedAt: time.Now()}
	}
	return out
}

func assertSet(t *testing.T, got map[string]struct{}, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, w := range want {
		if _, ok := got[w]; !ok {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			ctx := context.Background()
			pool, _ := pgtest.NewPool(t)
			s := newStore(t, pool, layout)
			if v, err := s.SchemaVersion(ctx); err != nil || v != 0 {
				t.Fatalf("SchemaVersion before migrate = %d, %v; want 0", v, err)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 3)
			for range 3 {
				wg.Go(func() { errs <- s.Migrate(ctx) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("concurrent migrate: %v", err)
				}
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("second migrate: %v", err)
			}
			if v, err := s.SchemaVersion(ctx); err != nil || v != SchemaVersion {
				t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, SchemaVersion)
			}
			other := config.LayoutPartitioned
			if layout == other {
				other = config.LayoutTable
			}
			if err := newStore(t, pool, other).Migrate(ctx); err == nil {
				t.Fatalf("migrating a %s inbox as %s must fail", layout, other)
			}
			for _, table := range []string{"inbox_orders", "inbox_orders_dead_letters", "inbox_orders_prune_runs", "inbox_orders_meta"} {
				var ok bool
				if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", "idc."+table).Scan(&ok); err != nil || !ok {
					t.Errorf("table idc.%s missing after migrate (%v)", table, err)
				}
			}
		})
	}
}

func TestClaimInBatchAndCrossBatchDuplicates(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			s, pool := migrated(t, layout)
			assertSet(t, claim(t, s, pool, ids("a", "b", "a", "c", "b")...), "a", "b", "c")
			assertSet(t, claim(t, s, pool, ids("c", "d", "a", "e")...), "d", "e")
			assertSet(t, claim(t, s, pool, ids("a", "b", "c", "d", "e")...))
			var n int
			if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM idc.inbox_orders").Scan(&n); err != nil || n != 5 {
				t.Fatalf("inbox rows = %d, %v; want 5", n, err)
			}
		})
	}
}

func TestClaimRolledBackIsNotKept(t *testing.T) {
	s, pool := migrated(t, config.LayoutTable)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, tx, ids("x")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	assertSet(t, claim(t, s, pool, ids("x")...), "x")
}

func TestPartitionedRefusesIDFromAnotherPartition(t *testing.T) {
	s, pool := migrated(t, config.LayoutPartitioned)
	today := Day(time.Now())
	assertSet(t, claim(t, s, pool, Claim{MessageID: "m1", PublishedAt: today.Add(-30 * time.Hour)}), "m1")
	assertSet(t, claim(t, s, pool, Claim{MessageID: "m1", PublishedAt: today.Add(2 * time.Hour)}))
	assertSet(t, claim(t, s, pool, Claim{MessageID: "m1", PublishedAt: today.Add(-30 * time.Hour)}))
	assertSet(t, claim(t, s, pool, Claim{MessageID: "m2", PublishedAt: today.Add(2 * time.Hour)}), "m2")
}

// Three replicas claim overlapping ids at once (for the Partitioned layout
// each under a different publish day): every id must be claimed exactly once.
func TestConcurrentClaimsClaimEachIDOnce(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			s, pool := migrated(t, layout)
			const universe = 300
			var mu sync.Mutex
			claimedBy := map[string]int{}
			var wg sync.WaitGroup
			for w := range 3 {
				wg.Go(func() {
					order := rand.Perm(universe)
					for start := 0; start < universe; start += 25 {
						batch := make([]Claim, 0, 25)
						for _, n := range order[start : start+25] {
							batch = append(batch, Claim{
								MessageID:   fmt.Sprintf("id-%d", n),
								PublishedAt: time.Now().AddDate(0, 0, -w),
							})
						}
						got, err := claimTx(s, pool, batch)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						for id := range got {
							claimedBy[id]++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(claimedBy) != universe {
				t.Fatalf("%d ids claimed, want %d", len(claimedBy), universe)
			}
			for id, n := range claimedBy {
				if n != 1 {
					t.Errorf("%s claimed %d times", id, n)
				}
			}
		})
	}
}

func TestExistingUnclaimAndDeadLetter(t *testing.T) {
	s, pool := migrated(t, config.LayoutTable)
	ctx := context.Background()
	claim(t, s, pool, ids("a", "b")...)
	got, err := s.Existing(ctx, pool, []string{"a", "z", "b"})
	if err != nil {
		t.Fatal(err)
	}
	assertSet(t, got, "a", "b")
	dl := DeadLetter{MessageID: "", NativeID: "S:1", Reason: "id: value missing\x00", Payload: []byte{0xff, 0},
		Headers: map[string]string{"k": "v\xff"}, Attempts: 1, PublishedAt: time.Now()}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := s.Unclaim(ctx, tx, []string{"a"}); err != nil {
			return err
		}
		inserted, err := s.DeadLetter(ctx, tx, []DeadLetter{dl, dl, {NativeID: "", Reason: "no native id"}})
		if err == nil && fmt.Sprint(inserted) != "[true false true]" {
			t.Errorf("inserted = %v, want [true false true]", inserted)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// A redelivery of the same poison message is not dead-lettered twice.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		inserted, err := s.DeadLetter(ctx, tx, []DeadLetter{dl})
		if err == nil && inserted[0] {
			t.Error("a redelivered dead letter was reported as new")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var n, nullIDs int
	if err := pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE message_id IS NULL) FROM idc.inbox_orders_dead_letters").Scan(&n, &nullIDs); err != nil {
		t.Fatal(err)
	}
	if n != 2 || nullIDs != 2 {
		t.Fatalf("dead letters = %d (null ids %d), want 2 (2)", n, nullIDs)
	}
	got, err = s.Existing(ctx, pool, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	assertSet(t, got, "b")
}

func TestPruneTableDeletesOnlyOlderThanCutoff(t *testing.T) {
	s, pool := migrated(t, config.LayoutTable)
	ctx := context.Background()
	const window = 48 * time.Hour
	// 3000 rows spread ±2h around the cutoff, at random.
	pgtest.Exec(t, pool, fmt.Sprintf(`INSERT INTO idc.inbox_orders (message_id, processed_at)
		SELECT 'id-' || g, now() - interval '%d seconds' + (random() * 4 - 2) * interval '1 hour'
		FROM generate_series(1, 3000) g`, int(window.Seconds())))
	var olderBefore int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idc.inbox_orders WHERE processed_at < now() - interval '48 hours'").Scan(&olderBefore); err != nil {
		t.Fatal(err)
	}
	res, err := s.PruneTable(ctx, Bound{Window: window}, 97, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var older, younger int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE processed_at < $1), count(*) FILTER (WHERE processed_at >= $1)
		FROM idc.inbox_orders`, res.Cutoff).Scan(&older, &younger); err != nil {
		t.Fatal(err)
	}
	if older != 0 {
		t.Errorf("%d rows older than the cutoff survived", older)
	}
	if younger+res.RowsDeleted != 3000 {
		t.Errorf("deleted %d + kept %d != 3000: something younger than the cutoff was deleted", res.RowsDeleted, younger)
	}
	// The cutoff is taken a moment after the count above, so it may cover a
	// few more rows, never fewer.
	if res.RowsDeleted < olderBefore || res.RowsDeleted < 1000 {
		t.Errorf("RowsDeleted = %d, want >= %d", res.RowsDeleted, olderBefore)
	}
	if d := time.Since(res.Cutoff) - window; d < -time.Minute || d > time.Minute {
		t.Errorf("cutoff %s is not now()-48h", res.Cutoff)
	}
	run, err := s.LastPruneRun(ctx)
	if err != nil || run == nil {
		t.Fatalf("LastPruneRun = %v, %v", run, err)
	}
	if run.RowsDeleted != res.RowsDeleted || run.FinishedAt == nil || run.Error != "" || run.Window != window || !run.Cutoff.Equal(res.Cutoff) {
		t.Errorf("prune run recorded as %+v, result %+v", run, res)
	}
	// A zero maxDuration deletes nothing but is still recorded.
	if res, err := s.PruneTable(ctx, Bound{Window: time.Hour}, 10, 0); err != nil || res.RowsDeleted != 0 {
		t.Errorf("PruneTable with no time = %+v, %v", res, err)
	}
	if next, _ := s.LastPruneRun(ctx); next == nil || next.ID <= run.ID {
		t.Errorf("second run not recorded: %+v", next)
	}
}

func TestPrunePartitionsDropsWholeOldDays(t *testing.T) {
	s, pool := migrated(t, config.LayoutPartitioned)
	ctx := context.Background()
	today := Day(time.Now())
	if err := s.EnsurePartitions(ctx, today.AddDate(0, 0, -10), 12); err != nil {
		t.Fatal(err)
	}
	for d := -10; d <= 1; d++ {
		claim(t, s, pool, Claim{MessageID: fmt.Sprintf("m%d", d), PublishedAt: today.AddDate(0, 0, d).Add(time.Hour)})
	}
	// Those ids were processed on their publish day...
	pgtest.Exec(t, pool, "UPDATE "+s.QualifiedInbox()+" SET processed_at = published_on + interval '1 hour'")
	// ...except one from a backlog: published 8 days ago, processed just now.
	// It can still be redelivered, so its partition must survive the prune.
	backlog := today.AddDate(0, 0, -8)
	claim(t, s, pool, Claim{MessageID: "backlog", PublishedAt: backlog.Add(2 * time.Hour)})
	if _, err := s.PruneTable(ctx, Bound{Window: time.Hour}, 10, time.Minute); err == nil {
		t.Error("PruneTable must refuse a Partitioned inbox")
	}
	const window = 4 * 24 * time.Hour
	res, err := s.PrunePartitions(ctx, Bound{Window: window})
	if err != nil {
		t.Fatal(err)
	}
	parts, err := s.listPartitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if !p.day.AddDate(0, 0, 1).After(res.Cutoff) && !p.day.Equal(backlog) {
			t.Errorf("partition %s is entirely older than cutoff %s but was kept", p.name, res.Cutoff)
		}
	}
	// Days -10..-5 end before now-4d; day -8 holds the backlog id; day -4
	// ends after the cutoff unless the test runs exactly at midnight.
	if res.PartitionsDropped != 5 || !parts[0].day.Equal(backlog) || !parts[1].day.Equal(today.AddDate(0, 0, -4)) {
		t.Errorf("dropped %d partitions, oldest left %v, %v; want 5 dropped, oldest %v then %v",
			res.PartitionsDropped, parts[0].day, parts[1].day, backlog, today.AddDate(0, 0, -4))
	}
	assertSet(t, claim(t, s, pool, Claim{MessageID: "backlog", PublishedAt: backlog.Add(2 * time.Hour)}))
	run, err := s.LastPruneRun(ctx)
	if err != nil || run == nil || run.PartitionsDropped != 5 || run.Error != "" {
		t.Fatalf("LastPruneRun = %+v, %v", run, err)
	}
	// A message of a pruned day re-creates its partition on demand.
	old := today.AddDate(0, 0, -9)
	if err := s.EnsurePartitionsFor(ctx, []time.Time{old}); err != nil {
		t.Fatal(err)
	}
	assertSet(t, claim(t, s, pool, Claim{MessageID: "late", PublishedAt: old}), "late")
}

func TestStatsAndDrop(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			s, pool := migrated(t, layout)
			ctx := context.Background()
			claim(t, s, pool, ids("a", "b", "c")...)
			pgtest.Exec(t, pool, "UPDATE idc.inbox_orders SET processed_at = now() - interval '1 hour' WHERE message_id = 'a'", "ANALYZE idc.inbox_orders")
			st, err := s.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.OldestAge < 59*time.Minute || st.OldestAge > 61*time.Minute {
				t.Errorf("OldestAge = %s, want ~1h", st.OldestAge)
			}
			if st.Rows < 0 || st.Rows > 4 {
				t.Errorf("Rows = %d, want an estimate of 3", st.Rows)
			}
			for range 2 {
				if err := s.Drop(ctx); err != nil {
					t.Fatalf("Drop: %v", err)
				}
			}
			var left int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'idc'").Scan(&left); err != nil || left != 0 {
				t.Fatalf("%d tables left after Drop (%v)", left, err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("migrate after drop: %v", err)
			}
		})
	}
}

func TestDerivedNameStaysDistinct(t *testing.T) {
	long := "a234567890123456789012345678901234567890123456789012345678901"
	a, b := DerivedName(long, "_p20240101"), DerivedName(long, "_p20240102")
	if len(a) > 63 || a == b {
		t.Fatalf("derived names %q, %q must be distinct and at most 63 bytes", a, b)
	}
	if got := DerivedName("inbox", "_meta"); got != "inbox_meta" {
		t.Fatalf("DerivedName = %q", got)
	}
}

// schemaTables lists the tables of schema idc, sorted.
func schemaTables(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var created []string
	rows, err := pool.Query(context.Background(), "SELECT tablename FROM pg_tables WHERE schemaname = 'idc' ORDER BY tablename")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		created = append(created, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return created
}

// Names.Provisioned is the inbox's own list of the tables Migrate creates
// for its options (the benchmarks count on it), and Names.Tables, which
// admission reserves, is every table any option creates.
func TestNamesProvisionedListsWhatMigrateCreates(t *testing.T) {
	for _, o := range []Options{{}, {Outbox: true}, {Redrives: true}, {Outbox: true, Redrives: true}} {
		t.Run(fmt.Sprintf("outbox=%v,redrives=%v", o.Outbox, o.Redrives), func(t *testing.T) {
			pool, _ := pgtest.NewPool(t)
			opts := []Option{WithOutbox(o.Outbox)}
			if o.Redrives {
				opts = append(opts, WithRedrives())
			}
			s := newStore(t, pool, config.LayoutTable, opts...)
			if err := s.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			listed := slices.Clone(s.Names().Provisioned(o))
			slices.Sort(listed)
			if created := schemaTables(t, pool); !slices.Equal(created, listed) {
				t.Fatalf("Migrate created %v, Names.Provisioned lists %v", created, listed)
			}
			if o.Outbox && o.Redrives && !slices.Equal(listed, slices.Sorted(slices.Values(s.Names().Tables()))) {
				t.Fatalf("with every option Migrate created %v, Names.Tables lists %v", listed, s.Names().Tables())
			}
		})
	}
}

// An inbox migrated without the optional tables gets each one when a store
// that uses it migrates (a resource that adds spec.emit, the first
// redrive), at the same schema version and without touching the tables it
// has; until then UpToDate says the migration is due.
func TestOptionalTablesAreCreatedWhenFirstUsed(t *testing.T) {
	ctx := context.Background()
	pool, dsn := pgtest.NewPool(t)
	plain := newStore(t, pool, config.LayoutTable)
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	n := plain.Names()
	if got := schemaTables(t, pool); slices.Contains(got, n.Outbox) || slices.Contains(got, n.Redrives) {
		t.Fatalf("an inbox without options has %v: no outbox nor redrives log expected", got)
	}
	if v, ok, err := plain.UpToDate(ctx); err != nil || !ok || v != SchemaVersion {
		t.Fatalf("plain store UpToDate = %d, %v, %v; want %d, true", v, ok, err, SchemaVersion)
	}
	// What the store without the tables reads of them is empty, not an
	// error, also on a pool that runs statements unprepared as the
	// controller's do (a missing table then shows only in rows.Err).
	if sum, err := plain.RedriveSummary(ctx, "never"); err != nil || len(sum.Outcomes) != 0 {
		t.Fatalf("RedriveSummary without the log = %+v, %v; want empty", sum, err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	execPool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer execPool.Close()
	if sum, err := newStore(t, execPool, config.LayoutTable).RedriveSummary(ctx, "never"); err != nil || len(sum.Outcomes) != 0 {
		t.Fatalf("RedriveSummary without the log on an unprepared-statement pool = %+v, %v; want empty", sum, err)
	}
	if n, err := plain.PruneOutbox(ctx, time.Hour, 100, time.Second); err != nil || n != 0 {
		t.Fatalf("PruneOutbox without the outbox = %d, %v; want 0, nil", n, err)
	}

	emitting := newStore(t, pool, config.LayoutTable, WithOutbox(true), WithRedrives())
	if _, ok, err := emitting.UpToDate(ctx); err != nil || ok {
		t.Fatalf("a store that uses the outbox on an inbox without one: UpToDate = %v, %v; want false", ok, err)
	}
	// A live replica holding a row lock on the inbox must not block the
	// creation: no DDL touches the existing tables.
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `INSERT INTO `+plain.QualifiedInbox()+` (message_id) VALUES ('held')`); err != nil {
		t.Fatal(err)
	}
	migrateCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := emitting.Migrate(migrateCtx); err != nil {
		t.Fatalf("creating the optional tables while a replica writes the inbox: %v", err)
	}
	if got := schemaTables(t, pool); !slices.Contains(got, n.Outbox) || !slices.Contains(got, n.Redrives) {
		t.Fatalf("after migrating with both options the schema has %v", got)
	}
	if v, ok, err := emitting.UpToDate(ctx); err != nil || !ok || v != SchemaVersion {
		t.Fatalf("after creating them UpToDate = %d, %v, %v; want %d, true", v, ok, err, SchemaVersion)
	}
}

// An inbox of schema version 5 has its tables' current shape: upgrading it
// runs no ALTER TABLE, so replicas writing the inbox (a row lock held here)
// do not wait on an ACCESS EXCLUSIVE lock when the operator is upgraded.
func TestUpgradeFromVersion5TouchesNoTable(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	s := newStore(t, pool, config.LayoutTable, WithOutbox(true), WithRedrives())
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+s.meta+` SET schema_version = 5`); err != nil {
		t.Fatal(err)
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	for _, table := range []string{s.inbox, s.outbox} {
		if _, err := holder.Exec(ctx, `LOCK TABLE `+table+` IN ROW EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
	}
	migrateCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := newStore(t, pool, config.LayoutTable).Migrate(migrateCtx); err != nil {
		t.Fatalf("upgrading a version-5 inbox while replicas write it: %v", err)
	}
	if v, err := s.SchemaVersion(ctx); err != nil || v != SchemaVersion {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, SchemaVersion)
	}
}

// An inbox of schema version 3 has an outbox without the columns version 4
// added: upgrading it with a store that does not ask for the outbox still
// upgrades the table it has, so a later emitting config finds it whole.
func TestUpgradeKeepsAndUpgradesTheOptionalTablesItHas(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	s := newStore(t, pool, config.LayoutTable, WithOutbox(true), WithRedrives())
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Make it look like version 3: the outbox as 3 created it.
	for _, st := range []string{
		`ALTER TABLE ` + s.outbox + ` DROP COLUMN headers, DROP COLUMN order_key, DROP COLUMN attempts, DROP COLUMN last_error`,
		`UPDATE ` + s.meta + ` SET schema_version = 3`,
	} {
		if _, err := pool.Exec(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	if err := newStore(t, pool, config.LayoutTable).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var cols int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_schema = 'idc' AND table_name = $1
		AND column_name IN ('headers', 'order_key', 'attempts', 'last_error')`, s.Names().Outbox).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	if cols != 4 {
		t.Fatalf("the upgraded outbox has %d of the 4 columns version 4 added", cols)
	}
	if got := schemaTables(t, pool); !slices.Contains(got, s.Names().Redrives) {
		t.Fatalf("the upgrade dropped the redrives log: %v", got)
	}
	if v, err := s.SchemaVersion(ctx); err != nil || v != SchemaVersion {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, SchemaVersion)
	}
}

// Inboxes sharing a schema migrate at once (they used to take turns on a
// schema-wide lock for the whole DDL), including into a schema none of
// them found.
func TestMigrateOfManyInboxesInOneNewSchema(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		s, err := New(pool, config.Sink{Schema: "shared", InboxTable: fmt.Sprintf("inbox_%d", i), Layout: config.LayoutTable})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { errs <- s.Migrate(ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate of inboxes in one schema: %v", err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'shared'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if want := 8 * len(NamesFor(config.Sink{InboxTable: "x"}).Provisioned(Options{})); n != want {
		t.Fatalf("%d tables in schema shared, want %d", n, want)
	}
}

// A role a DBA grants USAGE and CREATE on an existing schema, and nothing on
// the database, migrates: the schema is not created again.
func TestMigrateUnderASchemaOnlyRole(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	role := "idc_schema_only_" + strings.ReplaceAll(randomName(), "-", "_")
	pgtest.Exec(t, pool, "CREATE SCHEMA app",
		"CREATE ROLE "+role+" LOGIN",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT USAGE, CREATE ON SCHEMA app TO "+role)
	t.Cleanup(func() {
		pgtest.Exec(t, pool, "DROP OWNED BY "+role)
		admin, err := pgx.Connect(context.Background(), pgtest.AdminDSN())
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close(context.Background())
		pool.Close()
		if _, err := admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role); err != nil {
			t.Logf("dropping %s: %v", role, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	rolePool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rolePool.Close)
	s, err := New(rolePool, config.Sink{Schema: "app", InboxTable: "inbox_orders", Layout: config.LayoutTable})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate as a role with USAGE and CREATE on the schema only: %v", err)
	}
	if v, err := s.SchemaVersion(ctx); err != nil || v != SchemaVersion {
		t.Fatalf("SchemaVersion = %d, %v", v, err)
	}
}

func randomName() string { return fmt.Sprintf("%08x", rand.Uint32()) }

// TestUpgradedInboxHasTheShapeOfANewOne: a new inbox gets every column in
// its CREATE TABLE, an old one gets the later columns from upgradeDDL. The
// two must agree, column by column, or the runtime's SQL would work on one
// and fail on the other.
func TestUpgradedInboxHasTheShapeOfANewOne(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			ctx := context.Background()
			pool, _ := pgtest.NewPool(t)
			opts := []Option{WithOutbox(true), WithRedrives()}
			fresh, err := New(pool, config.Sink{Schema: "fresh", InboxTable: "inbox_orders", Layout: layout}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := fresh.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			old := newStore(t, pool, layout, opts...)
			if err := old.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			// Make it look like version 3: without what upgradeDDL and
			// outboxUpgradeDDL add.
			pgtest.Exec(t, pool,
				`ALTER TABLE `+old.inbox+` DROP COLUMN fingerprint`,
				`ALTER TABLE `+old.deadLetters+` DROP COLUMN reason_class`,
				`ALTER TABLE `+old.pruneRuns+` DROP COLUMN window_cutoff, DROP COLUMN held_reason, DROP COLUMN held_since`,
				`ALTER TABLE `+old.outbox+` DROP COLUMN headers, DROP COLUMN order_key, DROP COLUMN attempts, DROP COLUMN last_error`,
				`UPDATE `+old.meta+` SET schema_version = 3`,
			)
			if err := old.Migrate(ctx); err != nil {
				t.Fatalf("upgrading from version 3: %v", err)
			}
			want, got := columnsOf(t, pool, "fresh"), columnsOf(t, pool, "idc")
			if len(want) == 0 {
				t.Fatal("no columns read for the new inbox")
			}
			if !slices.Equal(got, want) {
				t.Errorf("upgraded inbox columns differ from a new inbox's:\n got %v\nwant %v", got, want)
			}
		})
	}
}

// columnsOf lists schema's columns as table.column type nullability
// default, in a stable order.
func columnsOf(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
		FROM information_schema.columns WHERE table_schema = $1 ORDER BY table_name, column_name`, schema)
	if err != nil {
		t.Fatal(err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cols {
		// Sequence defaults name the schema: nextval('idc.x_id_seq').
		cols[i] = strings.ReplaceAll(c, "'"+schema+".", "'")
	}
	return cols
}
