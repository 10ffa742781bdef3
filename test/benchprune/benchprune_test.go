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
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// claimer claims batches of new ids back to back, each in its own READ
// COMMITTED transaction after ensuring partitions, like the runtime, and
// records when each one started and ended. It stops between batches, never
// by cancelling one, so every committed claim is counted.
type claimer struct {
	store  *inbox.Store
	pool   *pgxpool.Pool
	prefix string

	mu      sync.Mutex
	samples []sample
	claimed int64
}

type sample struct{ start, end time.Time }

func (c *claimer) run(ctx context.Context, stop *atomic.Bool) error {
	for n := 0; !stop.Load(); n++ {
		claims := make([]inbox.Claim, claimBatch)
		now := time.Now()
		for i := range claims {
			claims[i] = inbox.Claim{MessageID: fmt.Sprintf("%s%d-%d", c.prefix, n, i), PublishedAt: now}
		}
		start := time.Now()
		got, err := c.claim(ctx, claims)
		end := time.Now()
		if err != nil {
			return fmt.Errorf("batch %d: %w", n, err)
		}
		if len(got) != claimBatch {
			return fmt.Errorf("batch %d: %d of %d new ids claimed as new", n, len(got), claimBatch)
		}
		c.mu.Lock()
		c.samples = append(c.samples, sample{start, end})
		c.claimed += int64(len(got))
		c.mu.Unlock()
	}
	return nil
}

func (c *claimer) claim(ctx context.Context, claims []inbox.Claim) (map[string]struct{}, error) {
	if err := c.store.EnsurePartitionsFor(ctx, []time.Time{claims[0].PublishedAt}); err != nil {
		return nil, err
	}
	tx, err := c.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	got, err := c.store.Claim(ctx, tx, claims)
	if err != nil {
		return nil, err
	}
	return got, tx.Commit(ctx)
}

func (c *claimer) completedAfter(t time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.samples {
		if s.end.After(t) {
			n++
		}
	}
	return n
}

// split returns the latencies of the claims that ended before the prune
// started (less the warm-up) and of those that overlapped the prune.
func (c *claimer) split(pruneStart, pruneEnd time.Time) (idle, during []time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.samples {
		switch {
		case !s.end.After(pruneStart):
			if i >= warmup {
				idle = append(idle, s.end.Sub(s.start))
			}
		case s.start.Before(pruneEnd):
			during = append(during, s.end.Sub(s.start))
		}
	}
	return idle, during
}

// waitFor polls cond until it holds or done is closed.
func waitFor(done <-chan struct{}, cond func() bool) {
	for !cond() {
		select {
		case <-done:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// percentile is the nearest-rank percentile (p=1 is the maximum).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func envInt(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(strings.ReplaceAll(v, "_", ""))
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func envDuration(tb testing.TB, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		tb.Fatalf("%s=%q: want a positive duration", name, v)
	}
	return d
}

func adminDSN() string {
	if v := os.Getenv(adminDSNEnv); v != "" {
		return v
	}
	return defaultAdminDSN
}

// newDatabase creates an empty database for the run and drops it (sessions
// forced out) when the benchmark or test ends, failed or not.
func newDatabase(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminDSN())
	if err != nil {
		tb.Fatalf("PostgreSQL is required for this benchmark and is unreachable: %v", err)
	}
	defer admin.Close(context.Background())
	suffix := make([]byte, 6)
	if _, err := rand.Read(suffix); err != nil {
		tb.Fatal(err)
	}
	name := "idc_bench_prune_" + hex.EncodeToString(suffix)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("while creating database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := pgx.Connect(ctx, adminDSN())
		if err != nil {
			tb.Errorf("while connecting to drop %s: %v", name, err)
			return
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Errorf("while dropping database %s: %v", name, err)
		}
	})
	cfg, err := pgx.ParseConfig(adminDSN())
	if err != nil {
		tb.Fatal(err)
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&application_name=%s", cfg.User, cfg.Host, cfg.Port, name, name)
}

func newPool(tb testing.TB, dsn string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func exec(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, stmts ...string) {
	tb.Helper()
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			tb.Fatalf("while running %q: %v", s, err)
		}
	}
}
