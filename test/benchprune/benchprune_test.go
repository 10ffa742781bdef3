// Package benchprune measures pruning an inbox holding millions of expired
// ids, layout Table (batched ctid deletes) against layout Partitioned (whole
// day partitions dropped), while a claimer keeps claiming batches of new ids
// the way the runtime does. Run it with `make bench-prune`. It needs
// PostgreSQL on loopback and fails (never skips) when it is down.
//
// For each layout it loads the expired ids in one INSERT … SELECT
// generate_series, vacuums and checkpoints, runs the claimer alone (idle
// claim latency), then runs the prune to completion with the claimer still
// going (claim latency during the prune), verifies that no expired id is
// left and every claim was kept, and drops the inbox. It prints
//
//	BENCH prune layout=<table|partitioned> rows=<n> seconds=<s> claim_p99_ms=<x> claim_p99_idle_ms=<y>
//	BENCH prune_progress_check layout=<…> records=<n> broker_calls=0 ms=<x>
//	RATIO prune_table_vs_partitioned=<table seconds / partitioned seconds>
//
// plus INFO lines with the load time, sample counts and the load average.
// IDC_BENCH_PRUNE_ROWS overrides the 5,000,000 expired ids, IDC_BENCH_PRUNE_IDLE
// the idle claim phase (default 20s), IDC_BENCH_PRUNE_BATCH the Table prune
// batch size (default 10000, the retention.prune.batchSize default) and
// IDC_BENCH_PRUNE_DAYS the number of expired day partitions (default 10).
//
// What to expect: the Table prune costs per row, the Partitioned prune per
// partition (one short transaction and one DROP each), so the ratio grows
// with the rows per expired day.
package benchprune

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// benchReplicas is how many live replicas' progress records the prune's
// progress check reads.
const benchReplicas = 8

const (
	// adminDSNEnv is the variable runtime/internal/pgtest reads as well.
	adminDSNEnv     = "IDC_TEST_PG_DSN"
	defaultAdminDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

	rowsEnv     = "IDC_BENCH_PRUNE_ROWS"
	defaultRows = 5_000_000
	idleEnv     = "IDC_BENCH_PRUNE_IDLE"
	defaultIdle = 20 * time.Second
	batchEnv    = "IDC_BENCH_PRUNE_BATCH"
	daysEnv     = "IDC_BENCH_PRUNE_DAYS"

	// claimBatch is the runtime's default batch size.
	claimBatch = 500
	// defaultPruneBatch is the default retention.prune.batchSize.
	defaultPruneBatch = 10_000
	// pruneMaxDuration lets the Table prune run to completion.
	pruneMaxDuration = 30 * time.Minute
	// window is the retention window; expired rows lie 1h to `days` days
	// before now()-window, on `days` whole days for the Partitioned layout.
	window             = 7 * 24 * time.Hour
	defaultExpiredDays = 10
	// warmup claims are left out of the idle percentile.
	warmup = 5
)

// params of one run.
type params struct {
	rows  int
	idle  time.Duration
	batch int
	days  int
}

// outcome of one layout.
type outcome struct {
	layout                 string
	rows, batch, days      int
	prune                  time.Duration
	load, vacuum           time.Duration
	idle, during           []time.Duration
	deleted, dropped       int64
	loadBefore, loadAfter  string
	claimsTotal, keptTotal int64
	// progressCheck is what bounding the cutoff by the replicas' progress
	// records cost before the prune (the prune job's check when every
	// replica is live: one query, no broker call).
	progressCheck   time.Duration
	progressRecords int
}

func BenchmarkPrune(b *testing.B) {
	p := params{
		rows:  envInt(b, rowsEnv, defaultRows),
		idle:  envDuration(b, idleEnv, defaultIdle),
		batch: envInt(b, batchEnv, defaultPruneBatch),
		days:  envInt(b, daysEnv, defaultExpiredDays),
	}
	ctx := b.Context()
	dsn := newDatabase(b)
	var out []outcome
	for _, layout := range []config.Layout{config.LayoutTable, config.LayoutPartitioned} {
		o := runLayout(b, ctx, dsn, layout, p)
		out = append(out, o)
		printOutcome(o)
		b.ReportMetric(o.prune.Seconds(), strings.ToLower(string(layout))+"_prune_s")
	}
	ratio := out[0].prune.Seconds() / out[1].prune.Seconds()
	fmt.Printf("RATIO prune_table_vs_partitioned=%.1f\n", ratio)
	b.ReportMetric(ratio, "table/partitioned")
}

// TestBenchPruneSmoke runs the whole benchmark on a tiny inbox so that the
// code behind `make bench-prune` cannot rot between runs.
func TestBenchPruneSmoke(t *testing.T) {
	dsn := newDatabase(t)
	for _, layout := range []config.Layout{config.LayoutTable, config.LayoutPartitioned} {
		o := runLayout(t, t.Context(), dsn, layout, params{rows: 20_000, idle: 500 * time.Millisecond, batch: 1000, days: 3})
		if len(o.idle) == 0 || len(o.during) == 0 {
			t.Errorf("%s: %d idle and %d during-prune claim samples, want some of both", layout, len(o.idle), len(o.during))
		}
	}
}

func printOutcome(o outcome) {
	fmt.Printf("BENCH prune layout=%s rows=%d seconds=%.4f claim_p99_ms=%.2f claim_p99_idle_ms=%.2f\n",
		o.layout, o.rows, o.prune.Seconds(), ms(percentile(o.during, 0.99)), ms(percentile(o.idle, 0.99)))
	fmt.Printf("BENCH prune_progress_check layout=%s records=%d broker_calls=0 ms=%.2f\n",
		o.layout, o.progressRecords, ms(o.progressCheck))
	fmt.Printf("INFO prune layout=%s prune_batch=%d expired_days=%d load_seconds=%.1f vacuum_checkpoint_seconds=%.1f rows_deleted=%d partitions_dropped=%d "+
		"claims_idle=%d claims_during=%d claim_p50_idle_ms=%.2f claim_p50_ms=%.2f claim_max_idle_ms=%.2f claim_max_ms=%.2f "+
		"claimed_ids=%d kept_ids=%d loadavg_before=%q loadavg_after=%q\n",
		o.layout, o.batch, o.days, o.load.Seconds(), o.vacuum.Seconds(), o.deleted, o.dropped,
		len(o.idle), len(o.during), ms(percentile(o.idle, 0.5)), ms(percentile(o.during, 0.5)),
		ms(percentile(o.idle, 1)), ms(percentile(o.during, 1)), o.claimsTotal, o.keptTotal, o.loadBefore, o.loadAfter)
}

// runLayout loads, measures and verifies one layout, then drops its inbox.
func runLayout(tb testing.TB, ctx context.Context, dsn string, layout config.Layout, p params) outcome {
	tb.Helper()
	o := outcome{layout: strings.ToLower(string(layout)), rows: p.rows, batch: p.batch, days: p.days, loadBefore: loadAvg()}
	sink := config.Sink{Schema: "bench", InboxTable: "inbox_" + o.layout, Layout: layout}
	// The runtime and the prune job are separate processes: separate pools
	// and stores (so separate partition caches).
	runtimePool, prunePool := newPool(tb, dsn), newPool(tb, dsn)
	runtimeStore, err := inbox.New(runtimePool, sink)
	if err != nil {
		tb.Fatal(err)
	}
	pruneStore, err := inbox.New(prunePool, sink)
	if err != nil {
		tb.Fatal(err)
	}
	if err := runtimeStore.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	today := inbox.Day(time.Now())
	// Days -(7+days) … -8 all end before now()-7d.
	firstExpired := today.AddDate(0, 0, -(int(window/(24*time.Hour)) + p.days))
	if layout == config.LayoutPartitioned {
		if err := runtimeStore.EnsurePartitions(ctx, firstExpired, p.days); err != nil {
			tb.Fatal(err)
		}
		if err := runtimeStore.EnsurePartitions(ctx, today.AddDate(0, 0, -1), 3); err != nil {
			tb.Fatal(err)
		}
	}

	start := time.Now()
	load(tb, ctx, runtimePool, runtimeStore, layout, p, firstExpired)
	o.load = time.Since(start)
	start = time.Now()
	exec(tb, ctx, runtimePool, "VACUUM (ANALYZE) "+runtimeStore.QualifiedInbox(), "CHECKPOINT")
	o.vacuum = time.Since(start)

	c := &claimer{store: runtimeStore, pool: runtimePool, prefix: "live-" + o.layout + "-"}
	var stopClaimer atomic.Bool
	done := make(chan struct{})
	var claimErr error
	go func() {
		defer close(done)
		claimErr = c.run(ctx, &stopClaimer)
	}()
	// The idle phase: p.idle, and enough claims for a percentile.
	time.Sleep(p.idle)
	waitFor(done, func() bool { return c.completedAfter(time.Time{}) >= warmup+10 })

	// The replicas' progress records, as live runtimes write them; the
	// prune goes through the progress bound the prune job applies.
	for i := range benchReplicas {
		if err := runtimeStore.WriteHeartbeat(ctx, inbox.Heartbeat{Replica: fmt.Sprintf("bench-%s-%d", o.layout, i)}); err != nil {
			tb.Fatal(err)
		}
	}
	checkStart := time.Now()
	now, recs, err := pruneStore.Progress(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	hold := retention.BoundByProgress(now, window, recs, retention.Settlement{}, nil)
	o.progressCheck, o.progressRecords = time.Since(checkStart), len(recs)
	if hold.Held() {
		tb.Fatalf("%s: live replicas held the prune back: %s", layout, hold.Reason)
	}

	var res inbox.PruneResult
	pruneStart := time.Now()
	if layout == config.LayoutPartitioned {
		res, err = pruneStore.PrunePartitions(ctx, hold.Bound(window))
	} else {
		res, err = pruneStore.PruneTable(ctx, hold.Bound(window), p.batch, pruneMaxDuration)
	}
	pruneEnd := time.Now()
	o.prune = pruneEnd.Sub(pruneStart)
	// Keep claiming a moment so the claim in flight at the end is counted.
	waitFor(done, func() bool { return c.completedAfter(pruneEnd) >= 2 })
	stopClaimer.Store(true)
	<-done
	o.loadAfter = loadAvg()
	if err != nil {
		tb.Fatalf("%s prune: %v", layout, err)
	}
	if claimErr != nil {
		tb.Fatalf("%s claimer: %v", layout, claimErr)
	}
	o.deleted, o.dropped = res.RowsDeleted, int64(res.PartitionsDropped)
	o.idle, o.during = c.split(pruneStart, pruneEnd)
	o.claimsTotal = c.claimed

	verify(tb, ctx, runtimePool, runtimeStore, layout, p, res, &o)
	if err := runtimeStore.Drop(ctx); err != nil {
		tb.Fatal(err)
	}
	return o
}

// load writes the expired ids in one statement. Table: processed_at spread
// evenly over the 10 days before the cutoff, oldest first in the heap (the
// order they were claimed in). Partitioned: p.days consecutive days,
// the ids of one day contiguous, processed at the same old time.
func load(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, s *inbox.Store, layout config.Layout, p params, firstExpired time.Time) {
	tb.Helper()
	var err error
	if layout == config.LayoutPartitioned {
		_, err = pool.Exec(ctx, `INSERT INTO `+s.QualifiedInbox()+` (message_id, published_on, processed_at)
			SELECT 'exp-' || lpad(g::text, 10, '0'), $2::date + ((g - 1)::bigint * $3::int / $1::int)::int,
				now() - $4::bigint * interval '1 microsecond' - interval '1 hour'
			FROM generate_series(1, $1::int) AS g`,
			p.rows, pgtype.Date{Time: firstExpired, Valid: true}, p.days, window.Microseconds())
	} else {
		_, err = pool.Exec(ctx, `INSERT INTO `+s.QualifiedInbox()+` (message_id, processed_at)
			SELECT 'exp-' || lpad(g::text, 10, '0'),
				now() - $2::bigint * interval '1 microsecond' - interval '1 hour'
					- (($1::int - g)::float8 / $1::int) * ($3::int * interval '1 day')
			FROM generate_series(1, $1::int) AS g`,
			p.rows, window.Microseconds(), p.days)
	}
	if err != nil {
		tb.Fatalf("while loading %d expired ids: %v", p.rows, err)
	}
}

// verify: no expired id left, all of them deleted exactly once (Table) or
// every expired day dropped (Partitioned), every claim still there.
func verify(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, s *inbox.Store, layout config.Layout, p params, res inbox.PruneResult, o *outcome) {
	tb.Helper()
	var expiredLeft, older int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE message_id LIKE 'exp-%'),
		count(*) FILTER (WHERE processed_at < $1), count(*) FILTER (WHERE message_id LIKE 'live-%')
		FROM `+s.QualifiedInbox(), res.Cutoff).Scan(&expiredLeft, &older, &o.keptTotal); err != nil {
		tb.Fatal(err)
	}
	if expiredLeft != 0 || older != 0 {
		tb.Fatalf("%s: %d expired ids and %d rows older than the cutoff left after the prune, want 0", layout, expiredLeft, older)
	}
	if o.keptTotal != o.claimsTotal {
		tb.Fatalf("%s: %d ids claimed during the bench, %d in the inbox", layout, o.claimsTotal, o.keptTotal)
	}
	if layout == config.LayoutTable && res.RowsDeleted != int64(p.rows) {
		tb.Fatalf("table: RowsDeleted = %d, want %d", res.RowsDeleted, p.rows)
	}
	if layout == config.LayoutPartitioned && res.PartitionsDropped != p.days {
		tb.Fatalf("partitioned: PartitionsDropped = %d, want %d", res.PartitionsDropped, p.days)
	}
}
