package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/internal/testbin"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/source"
	jsadapter "github.com/idempotency-dev/idc-operator/runtime/source/jetstream"
	"github.com/idempotency-dev/idc-operator/runtime/source/rabbitmq"
	"github.com/idempotency-dev/idc-operator/runtime/source/redisstreams"
)

const (
	amqpURI    = "amqp://guest:guest@127.0.0.1:5672/"
	amqpURIEnv = "IDC_BENCH_AMQP_URI"
	redisAddr  = "127.0.0.1:6379"
	dsnEnv     = "IDC_POSTGRES_DSN"

	// ceilingConns is how many connections drive the database ceiling.
	ceilingConns = 4
	// rowTimeout bounds one row of the table.
	rowTimeout = 4 * time.Minute
	// pollEvery is how often the replicas' idc_messages_total is read:
	// often enough to time a 2 s row to about 1%, rarely enough that the
	// scrapes (the process collector reads /proc) stay out of the profile.
	pollEvery = 25 * time.Millisecond
	// maxPollEvery bounds measure's sleep far from a row's end.
	maxPollEvery = 250 * time.Millisecond
)

// BenchmarkThroughput prints the throughput table of `make bench`, every
// row measured in this one run: the database ceiling (the claim + upsert SQL
// driven from Go, no broker), the idc-runtime binary as separate processes
// (as pods run it) for JetStream at replicas {1,2,4,8} x batchSize {100,500,
// 2000}, RabbitMQ, Redis Streams and Kafka (kfake) at 2 replicas each next
// to the broker alone (consume + ack, no database), peak RSS per replica,
// and the RATIO lines.
func BenchmarkThroughput(b *testing.B) {
	w := newWorkload()
	t := newThroughputEnv(b, w)
	if only := os.Getenv(rowsEnv); only != "" {
		t.runSelected(b, only)
		return
	}
	for range b.N {
		// The broker alone first: it also publishes the stream every
		// JetStream row reads, so no row is timed while NATS still writes
		// the fresh stream to disk.
		jsAlone := t.jetStreamAlone(b, 2)
		printRow(jsAlone)
		// The matrix runs twice and every row keeps its better run: on two
		// shared cores a burst of other work during one run of a 1-2 s row
		// would otherwise decide the scale-out and matrix lines.
		type cell struct{ replicas, batch int }
		var order []cell
		matrix := map[cell]row{}
		for range 2 {
			for _, batch := range []int{100, 500, 2000} {
				for _, replicas := range []int{1, 2, 4, 8} {
					c := cell{replicas, batch}
					r := t.runJetStream(b, replicas, batch)
					if prev, ok := matrix[c]; ok {
						r = fasterRow(prev, r)
					} else {
						order = append(order, c)
					}
					matrix[c] = r
				}
			}
		}
		best := map[int]float64{}
		scale := map[int]float64{}
		for _, c := range order {
			r := matrix[c]
			printRow(r)
			if c.batch == 500 {
				printLocks(r)
			}
			best[c.replicas] = max(best[c.replicas], r.rate())
			if c.batch == 500 {
				scale[c.replicas] = r.rate()
			}
		}
		// Scaling out on shared keys without row-lock waits: the stream
		// partitioned by key, one consumer per partition (the better of
		// two runs each, as the matrix).
		parted := map[int]row{}
		for range 2 {
			for _, parts := range []int{4, 8} {
				r := t.runJetStreamPartitioned(b, parts, 500)
				if prev, ok := parted[parts]; ok {
					r = fasterRow(prev, r)
				}
				parted[parts] = r
			}
		}
		for _, parts := range []int{4, 8} {
			printRow(parted[parts])
			printLocks(parted[parts])
		}
		// The two rows of the headline ratio run twice, alternating
		// (ceiling, runtime, runtime, ceiling), and each keeps its better
		// run, for the same reason.
		// The headline also runs with batching Fixed (an idle fetch waits
		// for a whole batch: the loop before adaptive batching), in the
		// same alternation, for the side-by-side row.
		ceiling := t.dbCeiling(b)
		headline := t.runJetStream(b, 2, 500)
		fixed := t.runJetStreamWith(b, 2, 500, config.BatchingFixed)
		fixed = fasterRow(fixed, t.runJetStreamWith(b, 2, 500, config.BatchingFixed))
		headline = fasterRow(headline, t.runJetStream(b, 2, 500))
		ceiling = fasterRow(ceiling, t.dbCeiling(b))
		printRow(ceiling)
		headline.name = "jetstream_upsert_headline"
		printRow(headline)
		fixed.name = "jetstream_upsert_headline_fixed"
		printRow(fixed)
		// The scale-out and matrix lines use the matrix rows only: every
		// cell the better of the same two runs (folding the headline's two
		// extra runs into the 2-replica cell biased it upwards).
		printCPU(jsAlone)
		printCPU(ceiling)
		printCPU(headline)
		printCPU(fixed)

		rabbitAlone := t.rabbitAlone(b, 2)
		printRow(rabbitAlone)
		rabbit := t.runRabbitMQ(b, 2, 500)
		printRow(rabbit)
		printCPU(rabbit)
		printRow(t.redisAlone(b, 2))
		redisRow := t.runRedis(b, 2, 500)
		printRow(redisRow)
		kafkaRow := t.runKafka(b, 2, 500)
		printRow(kafkaRow)

		t.latencyRows(b, headline.rate(), rabbit.rate(), redisRow.rate(), kafkaRow.rate())

		fmt.Printf("RATIO runtime_vs_db_ceiling=%.2f\n", headline.rate()/ceiling.rate())
		fmt.Printf("RATIO adaptive_vs_fixed_headline=%.2f\n", headline.rate()/fixed.rate())
		fmt.Printf("RATIO rabbitmq_upsert_vs_alone=%.2f\n", rabbit.rate()/rabbitAlone.rate())
		fmt.Printf("SCALEOUT batch=500 replicas_1=%.0f replicas_2=%.0f replicas_4=%.0f replicas_8=%.0f (4 and 8 vs 2: %.2f %.2f)\n",
			scale[1], scale[2], scale[4], scale[8], scale[4]/scale[2], scale[8]/scale[2])
		fmt.Printf("SCALEOUT_PARTITIONED batch=500 partitions_4=%.0f partitions_8=%.0f (vs 2 replicas on one consumer: %.2f %.2f; lock waits at 8: %d partitioned, %d on one consumer)\n",
			parted[4].rate(), parted[8].rate(), parted[4].rate()/scale[2], parted[8].rate()/scale[2],
			parted[8].locks.waits, matrix[cell{8, 500}].locks.waits)
		worst := 1.0
		for _, c := range order {
			worst = min(worst, matrix[c].rate()/best[c.replicas])
		}
		fmt.Printf("MATRIX worst_row_vs_best_at_same_replicas=%.2f\n", worst)
		b.ReportMetric(headline.rate()/ceiling.rate(), "runtime_vs_db_ceiling")
	}
}

// rowsEnv selects JetStream rows to run instead of the whole table, in
// order, as replicasxbatch items (IDC_BENCH_ROWS=2x500,8x500,8x100): a quick
// way to reproduce one row or compare two side by side.
const rowsEnv = "IDC_BENCH_ROWS"

func (t *throughputEnv) runSelected(b *testing.B, only string) {
	b.Helper()
	jsAlone := t.jetStreamAlone(b, 2) // publishes the stream
	printRow(jsAlone)
	for _, item := range strings.Split(only, ",") {
		if strings.TrimSpace(item) == "latency" {
			// The JetStream latency rows, at the shares of a 2 x 500 row
			// measured here.
			r := t.runJetStream(b, 2, 500)
			printRow(r)
			printCPU(r)
			t.latencyRows(b, r.rate(), 0, 0, 0)
			continue
		}
		if item := strings.TrimSpace(item); item == "latency-rabbitmq" || item == "latency-redis" || item == "latency-kafka" {
			// One broker's latency row at 50% of its own 2 x 500 row,
			// measured here first.
			var r row
			var rates [3]float64
			switch item {
			case "latency-rabbitmq":
				r = t.runRabbitMQ(b, 2, 500)
				rates[0] = r.rate()
			case "latency-redis":
				r = t.runRedis(b, 2, 500)
				rates[1] = r.rate()
			default:
				r = t.runKafka(b, 2, 500)
				rates[2] = r.rate()
			}
			printRow(r)
			printCPU(r)
			t.brokerLatencyRows(b, rates[0], rates[1], rates[2])
			continue
		}
		if strings.TrimSpace(item) == "rabbitmq" {
			// RabbitMQ alone and RabbitMQ -> upsert, with their ratio.
			alone := t.rabbitAlone(b, 2)
			printRow(alone)
			printCPU(alone)
			r := t.runRabbitMQ(b, 2, 500)
			printRow(r)
			printCPU(r)
			fmt.Printf("RATIO rabbitmq_upsert_vs_alone=%.2f\n", r.rate()/alone.rate())
			continue
		}
		if strings.TrimSpace(item) == "fixed" {
			r := t.runJetStreamWith(b, 2, 500, config.BatchingFixed)
			r.name = "jetstream_upsert_fixed"
			printRow(r)
			printCPU(r)
			continue
		}
		// <replicas>x<batch>[@base][:NAME=VALUE]: @base runs the binary
		// IDC_BENCH_BASELINE_BIN names (an earlier build, for a before /
		// after in one run); NAME=VALUE is an environment variable for the
		// replicas, e.g. 2x500:GOGC=100.
		spec, env, _ := strings.Cut(strings.TrimSpace(item), ":")
		spec, base := strings.CutSuffix(spec, "@base")
		if base {
			bin := os.Getenv(baselineEnv)
			if bin == "" {
				b.Fatalf("%s: %q needs %s", rowsEnv, item, baselineEnv)
			}
			saved := t.bin
			t.bin = bin
			r := t.runJetStreamEnv(b, 0, 0, "", "@"+spec)
			t.bin = saved
			r.name += "_baseline"
			printRow(r)
			printCPU(r)
			continue
		}
		if p, ok := strings.CutSuffix(spec, "p"); ok {
			// <parts>x<batch>p: the key-partitioned row.
			var parts, batch int
			if _, err := fmt.Sscanf(p, "%dx%d", &parts, &batch); err != nil || parts < 1 || batch < 1 {
				b.Fatalf("%s: %q is not <partitions>x<batch>p", rowsEnv, item)
			}
			r := t.runJetStreamPartitioned(b, parts, batch)
			printRow(r)
			printCPU(r)
			continue
		}
		var replicas, batch int
		if _, err := fmt.Sscanf(spec, "%dx%d", &replicas, &batch); err != nil || replicas < 1 || batch < 1 {
			b.Fatalf("%s: %q is not <replicas>x<batch>[:NAME=VALUE]", rowsEnv, item)
		}
		var r row
		if env != "" {
			r = t.runJetStreamEnv(b, replicas, batch, config.BatchingAdaptive, env)
			r.name += "_" + strings.ToLower(strings.ReplaceAll(env, "=", ""))
		} else {
			r = t.runJetStream(b, replicas, batch)
		}
		printRow(r)
		printCPU(r)
	}
}

func fasterRow(a, b row) row {
	if b.rate() > a.rate() {
		return b
	}
	return a
}

// row is one line of the table.
type row struct {
	name     string
	replicas int
	batch    int
	msgs     int
	elapsed  time.Duration
	rssMiB   float64 // peak RSS of the largest replica; 0 when in-process
	note     string
	// cpu is where the cores went while the row was timed.
	cpu *cpuUse
	// locks is what sampleLockWaits saw during the row (JetStream rows).
	locks lockStats
}

func (r row) rate() float64 { return float64(r.msgs) / r.elapsed.Seconds() }

func printRow(r row) {
	rss := "-"
	if r.rssMiB > 0 {
		rss = fmt.Sprintf("%.1f", r.rssMiB)
	}
	note := ""
	if r.note != "" {
		note = " note=" + strconv.Quote(r.note)
	}
	fmt.Printf("BENCH row=%s replicas=%d batch=%d msgs=%d seconds=%.3f msgs_per_s=%.0f peak_rss_mib_per_replica=%s%s\n",
		r.name, r.replicas, r.batch, r.msgs, r.elapsed.Seconds(), r.rate(), rss, note)
}

func printCPU(r row) {
	if r.cpu != nil {
		per := ""
		if r.msgs > 0 {
			per = " " + r.cpu.perMessage(r.msgs)
		}
		fmt.Printf("CPU row=%s %s%s\n", r.name, r.cpu, per)
	}
	printLocks(r)
}

func printLocks(r row) {
	if l := r.locks; l.samples > 0 {
		holders := ""
		if l.holders {
			holders = fmt.Sprintf(" holders: committing=%d idle_in_tx=%d chained=%d running=%d other=%d",
				l.committing, l.idle, l.chained, l.running, l.other)
		}
		fmt.Printf("LOCKS row=%s replicas=%d batch=%d lock_transactionid_waits=%d (claim %d, effect %d) samples=%d every=%s%s\n",
			r.name, r.replicas, r.batch, l.waits, l.claim, l.waits-l.claim, l.samples, lockSampleEvery, holders)
	}
}

// lockSampleEvery is how often sampleLockWaits reads pg_stat_activity.
const lockSampleEvery = 10 * time.Millisecond

// lockStats is what sampleLockWaits saw over a row.
type lockStats struct {
	// waits is how many backends it found waiting on another
	// transaction's row lock over samples samples; claim of them in the
	// inbox claim (an id another transaction claimed and has not committed
	// yet), the rest in the effect (a key another transaction upserted).
	waits, claim, samples int
	// What the transactions they waited for were doing (each counted once
	// per sample): in COMMIT (its WAL flush), idle in transaction (between
	// two statements: the client's round trip), waiting on a lock
	// themselves (a chain), or running a statement.
	// Only with IDC_BENCH_LOCK_HOLDERS=1: pg_blocking_pids takes the lock
	// manager's partition locks, so sampling it every 10 ms slows the
	// rows it measures. other is a blocker that had finished (or was
	// between transactions) by the time pg_stat_activity was read.
	committing, idle, chained, running, other int
	holders                                   bool
}

// sampleLockWaits samples pg_stat_activity every lockSampleEvery until the
// returned func is called: the backends waiting on another transaction's
// row lock (wait_event Lock:transactionid: replicas upserting the same
// keys) and what their blockers were doing.
func (t *throughputEnv) sampleLockWaits() func() lockStats {
	stop := make(chan struct{})
	st := lockStats{holders: os.Getenv("IDC_BENCH_LOCK_HOLDERS") == "1"}
	done := tickUntil(stop, lockSampleEvery, func() {
		if one, err := t.lockSample(st.holders); err == nil {
			st.add(one)
		}
	})
	return func() lockStats {
		close(stop)
		<-done
		return st
	}
}

// lockSample is one look at pg_stat_activity: the waiters, and with
// holders what their blockers were doing.
func (t *throughputEnv) lockSample(holders bool) (lockStats, error) {
	var one lockStats
	if !holders {
		err := t.pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE query LIKE 'INSERT INTO %inbox%')
			FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'transactionid'`).Scan(&one.waits, &one.claim)
		return one, err
	}
	err := t.pool.QueryRow(context.Background(), `WITH w AS (
			SELECT pid, query FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'transactionid'),
		h AS (SELECT DISTINCT unnest(pg_blocking_pids(w.pid)) AS pid FROM w)
		SELECT (SELECT count(*) FROM w), (SELECT count(*) FROM w WHERE query LIKE 'INSERT INTO %inbox%'),
			count(*) FILTER (WHERE b.state = 'active' AND b.query ILIKE 'commit%'),
			count(*) FILTER (WHERE b.state LIKE 'idle in transaction%'),
			count(*) FILTER (WHERE b.state = 'active' AND NOT b.query ILIKE 'commit%' AND b.wait_event_type = 'Lock'),
			count(*) FILTER (WHERE b.state = 'active' AND NOT b.query ILIKE 'commit%' AND b.wait_event_type IS DISTINCT FROM 'Lock'),
			count(*) FILTER (WHERE b.state IS DISTINCT FROM 'active' AND b.state NOT LIKE 'idle in transaction%')
		FROM h JOIN pg_stat_activity b ON b.pid = h.pid`).Scan(&one.waits, &one.claim, &one.committing, &one.idle, &one.chained, &one.running, &one.other)
	return one, err
}

// add counts one sample.
func (st *lockStats) add(one lockStats) {
	st.waits += one.waits
	st.claim += one.claim
	st.committing += one.committing
	st.idle += one.idle
	st.chained += one.chained
	st.running += one.running
	st.other += one.other
	st.samples++
}

// workload is the stream content of every row: keys x versions unique
// events, shuffled, plus 20% re-sent duplicates.
type workload struct {
	bodies [][]byte
	unique int
}

func newWorkload() *workload {
	return &workload{bodies: benchBodies(), unique: keys * versions}
}

// throughputEnv holds what the rows share: the built binary, the database
// and the broker clients.
type throughputEnv struct {
	w    *workload
	bin  string
	dsn  string
	pool *pgxpool.Pool
	nc   *nats.Conn
	js   jetstream.JetStream
	dir  string
	runs int
	// stream is the published workload's stream (jetStreamStream).
	stream string
}

func newThroughputEnv(b *testing.B, w *workload) *throughputEnv {
	b.Helper()
	t := &throughputEnv{w: w, bin: testbin.Build(b, testbin.RuntimePackage, "idc-runtime"), dsn: newDatabase(b), dir: b.TempDir()}
	var err error
	if t.pool, err = pgxpool.New(context.Background(), t.dsn); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(t.pool.Close)
	if t.nc, err = nats.Connect(natsURL); err != nil {
		b.Fatalf("NATS JetStream at %s is required for the benchmark: %v", natsURL, err)
	}
	b.Cleanup(t.nc.Close)
	if t.js, err = jetstream.New(t.nc, jetstream.WithPublishAsyncMaxPending(4000)); err != nil {
		b.Fatal(err)
	}
	return t
}

// schema creates a fresh schema with the orders table for one row.
func (t *throughputEnv) schema(b *testing.B) string {
	b.Helper()
	t.runs++
	s := fmt.Sprintf("t%d", t.runs)
	for _, q := range []string{
		"CREATE SCHEMA " + s,
		"CREATE TABLE " + s + ".orders (key text PRIMARY KEY, version int NOT NULL, status text NOT NULL, amount numeric NOT NULL)",
	} {
		if _, err := t.pool.Exec(context.Background(), q); err != nil {
			b.Fatalf("running %q: %v", q, err)
		}
	}
	return s
}

// checkResult fails the benchmark unless the row's table holds the latest
// version of every key and the inbox every unique id exactly once, then
// drops the row's schema: left behind, its fresh 100k-row tables are
// autovacuumed and analyzed while the next rows run, and that PostgreSQL
// work was charged to them (measured: a second 2-replica row ran at 40k
// msg/s after the 4- and 8-replica rows, 66k before them, with postgres
// CPU 2.12 s against 1.29 s).
func (t *throughputEnv) checkResult(b *testing.B, schema string) {
	b.Helper()
	defer t.dropSchema(b, schema)
	b.Helper()
	var rows, notLatest, inboxRows int
	err := t.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT
		(SELECT count(*) FROM %[1]s.orders), (SELECT count(*) FROM %[1]s.orders WHERE version <> $1),
		(SELECT count(*) FROM %[1]s.inbox)`, schema), versions).Scan(&rows, &notLatest, &inboxRows)
	if err != nil {
		b.Fatal(err)
	}
	if rows != keys || notLatest != 0 || inboxRows != t.w.unique {
		b.Fatalf("schema %s: %d rows (want %d), %d not at version %d, %d inbox rows (want %d)",
			schema, rows, keys, notLatest, versions, inboxRows, t.w.unique)
	}
}

func (t *throughputEnv) dropSchema(b *testing.B, schema string) {
	b.Helper()
	if _, err := t.pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		b.Fatalf("dropping schema %s: %v", schema, err)
	}
	// Each row writes some 50 MB of WAL; left to max_wal_size, the
	// checkpoints they trigger land in whichever later row happens to run
	// then. One here starts every row from the same state.
	if _, err := t.pool.Exec(context.Background(), "CHECKPOINT"); err != nil {
		b.Fatalf("checkpoint after row %s: %v", schema, err)
	}
}

func runtimeConfig(schema string, src config.Source, batch int) config.Config {
	eff, entity := upsertConfig()
	return config.Config{
		Version: config.Version, Name: "bench/" + schema, Source: src,
		Message: config.Message{ID: config.Extractor{JSONPath: "$.id"}, Entity: entity},
		Sink:    config.Sink{DSNEnv: dsnEnv, Schema: schema, InboxTable: "inbox", Layout: config.LayoutTable, Effect: eff},
		Delivery: config.Delivery{BatchSize: batch, MaxWait: config.Duration{Duration: maxWait},
			BackoffInitial: config.Duration{Duration: 100 * time.Millisecond}, BackoffMax: config.Duration{Duration: time.Second}},
	}
}

// --- the database ceiling ---

// dbCeiling runs the runtime's own claim + upsert (inbox.Store.Claim and
// effect.Apply in one transaction) over ceilingConns connections on
// pre-built batches of 500, with no broker: what PostgreSQL alone sustains.
func (t *throughputEnv) dbCeiling(b *testing.B) row {
	b.Helper()
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{}, batchSize)
	store, err := inbox.New(t.pool, cfg.Sink)
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	eff, err := effect.New(cfg.Sink.Effect, schema, cfg.Message.Entity)
	if err != nil {
		b.Fatal(err)
	}
	batches := t.prebuiltBatches(b, batchSize)
	work := make(chan []*extract.Message, len(batches))
	for _, bt := range batches {
		work <- bt
	}
	close(work)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, ceilingConns)
	cpuStart := takeCPU()
	start := time.Now()
	for range ceilingConns {
		wg.Go(func() {
			for recs := range work {
				if err := claimAndApply(ctx, t.pool, store, eff, recs); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuSince(cpuStart)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	t.checkResult(b, schema)
	return row{name: "db_ceiling", replicas: ceilingConns, batch: batchSize, msgs: len(t.w.bodies), elapsed: elapsed, cpu: cpu,
		note: fmt.Sprintf("claim+upsert from Go, %d connections, no broker", ceilingConns)}
}

// prebuiltBatches extracts ids up front and de-duplicates within each
// batch, as the runtime's prepare step does.
func (t *throughputEnv) prebuiltBatches(b *testing.B, size int) [][]*extract.Message {
	b.Helper()
	id := extract.MustCompile("$.id")
	var out [][]*extract.Message
	for i := 0; i < len(t.w.bodies); i += size {
		seen := map[string]bool{}
		var recs []*extract.Message
		for _, body := range t.w.bodies[i:min(i+size, len(t.w.bodies))] {
			m := extract.NewMessage(source.Message{Body: body, PublishedAt: time.Now()})
			v, err := id.Text(m)
			if err != nil {
				b.Fatal(err)
			}
			if seen[v] {
				continue
			}
			seen[v] = true
			m.ID = v
			recs = append(recs, m)
		}
		out = append(out, recs)
	}
	return out
}

func claimAndApply(ctx context.Context, pool *pgxpool.Pool, store *inbox.Store, eff effect.Effect, recs []*extract.Message) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		claims := make([]inbox.Claim, len(recs))
		for i, m := range recs {
			claims[i] = inbox.Claim{MessageID: m.ID, PublishedAt: m.PublishedAt}
		}
		fresh, err := store.Claim(ctx, tx, claims)
		if err != nil {
			return err
		}
		newRecs := make([]*extract.Message, 0, len(fresh))
		for _, m := range recs {
			if _, ok := fresh[m.ID]; ok {
				newRecs = append(newRecs, m)
			}
		}
		_, err = eff.Apply(ctx, tx, newRecs)
		return err
	})
}

// --- the runtime as processes ---

// replicaSet is the idc-runtime processes of one row.
type replicaSet struct {
	cmds    []*exec.Cmd
	metrics []string
	logs    []string
	// cpu is set by measure: the CPU spent from the first settled batch
	// to the last.
	cpu *cpuUse
	// acked, when set, counts the messages the broker has seen
	// acknowledged; measure polls it instead of scraping every replica.
	acked func() int
}

func (t *throughputEnv) startReplicas(b *testing.B, cfg config.Config, n int, env ...string) *replicaSet {
	b.Helper()
	cfg.Delivery.Replicas = n
	cfgs := make([]config.Config, n)
	for i := range cfgs {
		cfgs[i] = cfg
	}
	return t.startReplicasEach(b, cfgs, env...)
}

// startReplicasEach starts one idc-runtime process per config (replica i
// runs cfgs[i]).
func (t *throughputEnv) startReplicasEach(b *testing.B, cfgs []config.Config, env ...string) *replicaSet {
	b.Helper()
	rs := &replicaSet{}
	for i, cfg := range cfgs {
		addr, err := freeAddr()
		if err != nil {
			b.Fatal(err)
		}
		c := cfg
		c.HealthAddr = addr
		data, err := json.Marshal(&c)
		if err != nil {
			b.Fatal(err)
		}
		name := fmt.Sprintf("%s-r%d", cfg.Sink.Schema, i)
		path := filepath.Join(t.dir, name+".json")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			b.Fatal(err)
		}
		logPath := filepath.Join(t.dir, name+".log")
		logFile, err := os.Create(logPath)
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(t.bin, "run", "--config", path, "--consumer-name", name)
		cmd.Env = append(os.Environ(), dsnEnv+"="+t.dsn, amqpURIEnv+"="+amqpURI)
		// IDC_BENCH_REPLICA_ENV="GOMAXPROCS=1 GOGC=200": for every replica
		// of every row (an A/B of runtime settings against a whole table).
		cmd.Env = append(cmd.Env, strings.Fields(os.Getenv("IDC_BENCH_REPLICA_ENV"))...)
		if dir := os.Getenv("IDC_BENCH_CPU_PROFILES"); dir != "" {
			// A diagnostic: every replica of every row writes a CPU
			// profile (a row's env below may name it more precisely).
			cmd.Env = append(cmd.Env, "IDC_CPU_PROFILE="+filepath.Join(dir, name+".pprof"))
		}
		for _, e := range env {
			cmd.Env = append(cmd.Env, strings.ReplaceAll(e, "{replica}", strconv.Itoa(i)))
		}
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		_ = logFile.Close()
		rs.cmds = append(rs.cmds, cmd)
		rs.metrics = append(rs.metrics, "http://"+addr+"/metrics")
		rs.logs = append(rs.logs, logPath)
	}
	b.Cleanup(func() { rs.stop() })
	return rs
}

// settled sums idc_messages_total over the replicas (a replica not up yet
// counts 0).
func (rs *replicaSet) settled() int {
	if rs.acked != nil {
		return rs.acked()
	}
	total := 0
	for _, u := range rs.metrics {
		total += scrapeCounter(u, "idc_messages_total")
	}
	return total
}

// commits sums the replicas' transactions and their time in COMMIT so far
// (idc_commit_duration_seconds).
func (rs *replicaSet) commits() (int, float64) {
	n, secs := 0, 0.0
	for _, u := range rs.metrics {
		n += scrapeCounter(u, "idc_commit_duration_seconds_count")
		secs += scrapeFloat(u, "idc_commit_duration_seconds_sum")
	}
	return n, secs
}

// peakRSSMiB is the largest VmHWM (peak resident set) among the replicas.
func (rs *replicaSet) peakRSSMiB() float64 {
	peak := 0.0
	for _, c := range rs.cmds {
		peak = max(peak, vmHWM(c.Process.Pid))
	}
	return peak
}

func (rs *replicaSet) stop() {
	for _, c := range rs.cmds {
		if c.ProcessState == nil {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, c := range rs.cmds {
		if c.ProcessState == nil {
			_ = c.Wait()
		}
	}
}

// measure waits until the replicas settled total messages. It returns the
// messages settled after the first scrape that saw any, the time they took
// (to the scrape that saw the last), and the peak RSS. The processes'
// start-up, connect and migrate are not counted, and neither are the
// batches that had already settled at that first scrape: counting them
// without their time overstated rows whose first round is large (8
// replicas x 2 lanes x batch 2000 settle 32,000 messages at once; such a
// row once printed 166k msg/s, above the database ceiling).
func (rs *replicaSet) measure(b *testing.B, name string, total int) (int, time.Duration, float64) {
	b.Helper()
	deadline := time.Now().Add(rowTimeout)
	var first time.Time
	var before int
	var cpuStart cpuSnapshot
	for {
		n := rs.settled()
		now := time.Now()
		if n > 0 && first.IsZero() {
			first, before = now, n
			cpuStart = takeCPU(rs.pids()...)
		}
		if n >= total {
			rs.cpu = cpuSince(cpuStart, rs.pids()...)
			// Over the whole row: scraping at the first poll would cost
			// the timed window a scrape per replica.
			rs.cpu.commits, rs.cpu.commitSeconds = rs.commits()
			rss := rs.peakRSSMiB()
			rs.stop()
			if n == before {
				b.Fatalf("%s: all %d messages settled before the first scrape; nothing was timed", name, n)
			}
			return n - before, now.Sub(first), rss
		}
		if now.After(deadline) {
			b.Fatalf("%s: settled %d of %d messages in %s; logs: %v", name, n, total, rowTimeout, rs.logs)
		}
		for _, c := range rs.cmds {
			if c.ProcessState != nil {
				b.Fatalf("%s: a replica exited: %v; logs: %v", name, c.ProcessState, rs.logs)
			}
		}
		if rs.acked != nil {
			time.Sleep(pollEvery) // a broker request per poll: costs the replicas nothing
		} else {
			time.Sleep(nextPoll(n-before, now.Sub(first), total-n))
		}
	}
}

// nextPoll is how long measure sleeps before it looks again: pollEvery
// near the end, longer (up to maxPollEvery) while half the expected rest
// of the row is longer than that. Rows that count settled messages by
// scraping the replicas' /metrics (RabbitMQ, Redis, Kafka) paid for every
// scrape in the replicas' CPU (the process collector reads /proc: about
// 10% of a RabbitMQ replica's profile with a scrape every 25 ms).
func nextPoll(done int, took time.Duration, left int) time.Duration {
	if done <= 0 || took <= 0 {
		return pollEvery
	}
	rest := time.Duration(float64(left) / float64(done) * float64(took))
	return min(max(rest/2, pollEvery), maxPollEvery)
}

// runJetStream is one row: n replicas of the binary on a new durable
// consumer of the stream (created by the runtime, so sized by it).
func (t *throughputEnv) runJetStream(b *testing.B, replicas, batch int) row {
	b.Helper()
	return t.runJetStreamWith(b, replicas, batch, config.BatchingAdaptive)
}

func (t *throughputEnv) runJetStreamWith(b *testing.B, replicas, batch int, batching config.Batching) row {
	b.Helper()
	return t.runJetStreamEnv(b, replicas, batch, batching)
}

// baselineEnv names an earlier idc-runtime binary for @base rows.
const baselineEnv = "IDC_BENCH_BASELINE_BIN"

func (t *throughputEnv) runJetStreamEnv(b *testing.B, replicas, batch int, batching config.Batching, env ...string) row {
	b.Helper()
	if len(env) == 1 && strings.HasPrefix(env[0], "@") {
		// A baseline row: "@<replicas>x<batch>", the config without the
		// fields the earlier binary does not know.
		if _, err := fmt.Sscanf(env[0], "@%dx%d", &replicas, &batch); err != nil {
			b.Fatal(err)
		}
		env = nil
	}
	stream := t.jetStreamStream(b)
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: stream, Consumer: "c_" + schema}}, batch)
	cfg.Delivery.Batching = batching
	if dir := os.Getenv("IDC_BENCH_CPU_PROFILES"); dir != "" {
		// A diagnostic: every JetStream replica writes a CPU profile.
		env = append(env, "IDC_CPU_PROFILE="+filepath.Join(dir, fmt.Sprintf("%s-r%d-b%d-{replica}.pprof", schema, replicas, batch)))
	}
	rs := t.startReplicas(b, cfg, replicas, env...)
	rs.acked = t.jetStreamAcked(stream, "c_"+schema, len(t.w.bodies))
	locks := t.sampleLockWaits()
	timed, elapsed, rss := rs.measure(b, "jetstream", len(t.w.bodies))
	lockStats := locks()
	t.checkResult(b, schema)
	if err := t.js.DeleteConsumer(context.Background(), stream, "c_"+schema); err != nil {
		b.Fatalf("deleting the row's durable consumer: %v", err)
	}
	return row{name: "jetstream_upsert", replicas: replicas, batch: batch, msgs: timed, elapsed: elapsed, rssMiB: rss, cpu: rs.cpu,
		locks: lockStats}
}

// runJetStreamPartitioned is the key-partitioned design for scaling out on
// shared keys: the workload is published to parts subjects by its key's
// hash (<stream>.p<i>.orders, as a NATS subject mapping with partition()
// or a producer that puts the partition in the subject would), and each of
// parts processes runs its own durable consumer filtered to one partition,
// into one inbox and one table. A key is then upserted by one process
// only, so replicas never wait on each other's row locks; dedup is intact
// because a message's copies carry its key, so they land in its partition.
func (t *throughputEnv) runJetStreamPartitioned(b *testing.B, parts, batch int) row {
	b.Helper()
	stream := t.partitionedStream(b, parts)
	schema := t.schema(b)
	cfgs := make([]config.Config, parts)
	for i := range parts {
		durable := fmt.Sprintf("c_%s_p%d", schema, i)
		cfgs[i] = runtimeConfig(schema, config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: stream,
			Consumer: durable, FilterSubject: fmt.Sprintf("%s.p%d.>", stream, i)}}, batch)
		cfgs[i].Delivery.Replicas = 1
	}
	// Settled messages are counted from the replicas' metrics (polled
	// less often far from the end), not from consumer info: on nats-server
	// 2.9 the info of a filtered consumer makes the server count its
	// pending messages by scanning the stream, and eight of them polled
	// every 25 ms took the broker 31 s of CPU for 100k messages (the row
	// ran at 3k msg/s).
	rs := t.startReplicasEach(b, cfgs)
	locks := t.sampleLockWaits()
	timed, elapsed, rss := rs.measure(b, "jetstream partitioned", len(t.w.bodies))
	lockStats := locks()
	t.checkResult(b, schema)
	for i := range parts {
		if err := t.js.DeleteConsumer(context.Background(), stream, fmt.Sprintf("c_%s_p%d", schema, i)); err != nil {
			b.Fatalf("deleting partition %d's durable consumer: %v", i, err)
		}
	}
	return row{name: "jetstream_upsert_partitioned", replicas: parts, batch: batch, msgs: timed, elapsed: elapsed, rssMiB: rss,
		cpu: rs.cpu, locks: lockStats, note: fmt.Sprintf("%d subject partitions by key, one consumer each", parts)}
}

// partitionedStream publishes the workload on a stream of its own, each
// message to <stream>.p<fnv32a(key) mod parts>.orders.
func (t *throughputEnv) partitionedStream(b *testing.B, parts int) string {
	b.Helper()
	return t.publishStreamTo(b, fmt.Sprintf("IDC_PART%d", parts), t.w.bodies, func(stream string, body []byte) string {
		var o order
		if err := json.Unmarshal(body, &o); err != nil {
			b.Fatal(err)
		}
		h := fnv.New32a()
		_, _ = h.Write([]byte(o.Key))
		return fmt.Sprintf("%s.p%d.orders", stream, h.Sum32()%uint32(parts))
	})
}

// jetStreamAcked counts the messages the durable consumer has had
// acknowledged (of the stream's total), read from NATS:
// one request per poll whatever the replica count. Scraping every replica's
// /metrics every 25 ms instead cost the replicas CPU in proportion to their
// number (measured: see README), which the scale-out rows then paid for.
func (t *throughputEnv) jetStreamAcked(stream, durable string, total int) func() int {
	return func() int {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := t.js.Consumer(ctx, stream, durable)
		if err != nil {
			return 0 // not created yet by the replicas
		}
		// Every stream message is pending delivery, pending ack, or acked;
		// redeliveries count once (Delivered.Consumer would count them
		// again).
		info := c.CachedInfo()
		return total - int(info.NumPending) - info.NumAckPending
	}
}

// jetStreamStream publishes the workload once per environment on a stream
// every JetStream row of that environment reads with its own durable
// consumer. The stream belongs to the environment (the benchmark that made
// it deletes it at its end), so it is never shared between benchmarks: a
// process-wide one left BenchmarkThroughput reading the stream
// BenchmarkDeclaredLimits had deleted.
func (t *throughputEnv) jetStreamStream(b *testing.B) string {
	b.Helper()
	if t.stream == "" {
		t.stream = t.publishStream(b, "IDC_TPUT", t.w.bodies)
	}
	return t.stream
}

// consumeAlone runs n in-process adapters, each fetching batches of 500 and
// acknowledging them at once: the broker's own consume + ack rate.
func consumeAlone(b *testing.B, name string, total int, open func(i int) source.Source, n int) row {
	b.Helper()
	srcs := make([]source.Source, n)
	for i := range srcs {
		srcs[i] = open(i)
	}
	var mu sync.Mutex
	done := 0
	ctx, cancel := context.WithTimeout(context.Background(), rowTimeout)
	defer cancel()
	var wg sync.WaitGroup
	cpuStart := takeCPU()
	start := time.Now()
	for _, s := range srcs {
		wg.Go(func() {
			for ctx.Err() == nil {
				mu.Lock()
				finished := done >= total
				mu.Unlock()
				if finished {
					return
				}
				msgs, err := s.Fetch(ctx, batchSize, maxWait)
				if err == nil && len(msgs) > 0 {
					err = s.Ack(ctx, msgs)
				}
				if err != nil && ctx.Err() == nil {
					b.Errorf("%s: %v", name, err)
					return
				}
				mu.Lock()
				done += len(msgs)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuSince(cpuStart)
	for _, s := range srcs {
		_ = s.Close()
	}
	if done < total {
		b.Fatalf("%s: consumed %d of %d", name, done, total)
	}
	return row{name: name, replicas: n, batch: batchSize, msgs: done, elapsed: elapsed, cpu: cpu, note: "broker alone: consume + ack, no database"}
}

func (t *throughputEnv) jetStreamAlone(b *testing.B, n int) row {
	b.Helper()
	stream := t.jetStreamStream(b)
	cfg := &config.JetStream{URL: natsURL, Stream: stream, Consumer: fmt.Sprintf("alone_%d", time.Now().UnixNano())}
	d := config.Delivery{BatchSize: batchSize, InFlight: 2, Replicas: n}
	return consumeAlone(b, "jetstream_alone", len(t.w.bodies), func(int) source.Source {
		s, err := jsadapter.New(context.Background(), cfg, logr.Discard(), jsadapter.WithDelivery(d))
		if err != nil {
			b.Fatal(err)
		}
		return s
	}, n)
}

// --- RabbitMQ ---

// rabbitQueue declares a durable classic queue holding the workload.
func (t *throughputEnv) rabbitQueue(b *testing.B) string {
	b.Helper()
	conn, err := amqp.Dial(amqpURI)
	if err != nil {
		b.Fatalf("RabbitMQ at 127.0.0.1:5672 is required for the benchmark: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q := fmt.Sprintf("idc-bench-%d", time.Now().UnixNano())
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if c, err := amqp.Dial(amqpURI); err == nil {
			if ch, err := c.Channel(); err == nil {
				_, _ = ch.QueueDelete(q, false, false, false)
			}
			_ = c.Close()
		}
	})
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(t.w.bodies)))
	for _, body := range t.w.bodies {
		if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Body: body,
		}); err != nil {
			b.Fatal(err)
		}
	}
	for range t.w.bodies {
		if c := <-confirms; !c.Ack {
			b.Fatal("RabbitMQ refused a published message")
		}
	}
	return q
}

func (t *throughputEnv) runRabbitMQ(b *testing.B, replicas, batch int) row {
	b.Helper()
	q := t.rabbitQueue(b)
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: amqpURIEnv, Queue: q}}, batch)
	rs := t.startReplicas(b, cfg, replicas)
	timed, elapsed, rss := rs.measure(b, "rabbitmq", len(t.w.bodies))
	t.checkResult(b, schema)
	return row{name: "rabbitmq_upsert", replicas: replicas, batch: batch, msgs: timed, elapsed: elapsed, rssMiB: rss, note: "classic durable queue", cpu: rs.cpu}
}

func (t *throughputEnv) rabbitAlone(b *testing.B, n int) row {
	b.Helper()
	q := t.rabbitQueue(b)
	b.Setenv(amqpURIEnv, amqpURI)
	cfg := &config.RabbitMQ{URIEnv: amqpURIEnv, Queue: q, Prefetch: 2 * batchSize * 2}
	return consumeAlone(b, "rabbitmq_alone", len(t.w.bodies), func(int) source.Source {
		s, err := rabbitmq.New(context.Background(), cfg, logr.Discard())
		if err != nil {
			b.Fatal(err)
		}
		return s
	}, n)
}

// --- Redis Streams ---

func (t *throughputEnv) redisStream(b *testing.B) string {
	b.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		b.Fatalf("Redis at %s is required for the benchmark: %v", redisAddr, err)
	}
	stream := fmt.Sprintf("idc-bench-%d", time.Now().UnixNano())
	for i := 0; i < len(t.w.bodies); i += 1000 {
		pipe := rdb.Pipeline()
		for _, body := range t.w.bodies[i:min(i+1000, len(t.w.bodies))] {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"body", body}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		c := redis.NewClient(&redis.Options{Addr: redisAddr})
		_ = c.Del(context.Background(), stream).Err()
		_ = c.Close()
	})
	return stream
}

func (t *throughputEnv) runRedis(b *testing.B, replicas, batch int) row {
	b.Helper()
	stream := t.redisStream(b)
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{RedisStreams: &config.RedisStreams{Address: redisAddr, Stream: stream, Group: "g"}}, batch)
	rs := t.startReplicas(b, cfg, replicas)
	timed, elapsed, rss := rs.measure(b, "redis", len(t.w.bodies))
	t.checkResult(b, schema)
	return row{name: "redis_upsert", replicas: replicas, batch: batch, msgs: timed, elapsed: elapsed, rssMiB: rss}
}

func (t *throughputEnv) redisAlone(b *testing.B, n int) row {
	b.Helper()
	stream := t.redisStream(b)
	cfg := &config.RedisStreams{Address: redisAddr, Stream: stream, Group: "g", BodyField: "body", ClaimMinIdle: config.Duration{Duration: time.Minute}}
	return consumeAlone(b, "redis_alone", len(t.w.bodies), func(i int) source.Source {
		s, err := redisstreams.New(context.Background(), cfg, logr.Discard(), redisstreams.WithConsumerName(fmt.Sprintf("alone-%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		return s
	}, n)
}

// --- Kafka (kfake) ---

// runKafka runs the binary against franz-go's in-process kfake cluster: the
// only Kafka on this machine, and not representative of a real broker (no
// disk, no replication, and it shares the benchmark's process and cores).
func (t *throughputEnv) runKafka(b *testing.B, replicas, batch int) row {
	b.Helper()
	const topic = "idc-bench"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(2*replicas), topic))
	if err != nil {
		b.Fatal(err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	recs := make([]*kgo.Record, len(t.w.bodies))
	for i, body := range t.w.bodies {
		var o order
		_ = json.Unmarshal(body, &o)
		recs[i] = &kgo.Record{Key: []byte(o.Key), Value: body}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
	cl.Close()
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{Kafka: &config.Kafka{BootstrapServers: cluster.ListenAddrs(), Topics: []string{topic}, ConsumerGroup: "g"}}, batch)
	rs := t.startReplicas(b, cfg, replicas)
	timed, elapsed, rss := rs.measure(b, "kafka", len(t.w.bodies))
	t.checkResult(b, schema)
	return row{name: "kafka_kfake_upsert", replicas: replicas, batch: batch, msgs: timed, elapsed: elapsed, rssMiB: rss,
		note: "kfake in-process: NOT representative of a real Kafka broker; kfake ignores fetch max bytes (one fetch returns a whole partition), so this RSS is kfake's buffering, not the runtime's"}
}

// --- helpers ---

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// scrapeClient reads the replicas' counters every pollEvery without gzip:
// compressing 100 scrapes a second would cost the replicas CPU the rows
// are meant to measure.
var scrapeClient = &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableCompression: true}}

// scrapeCounter reads one unlabelled counter from a /metrics page; 0 when
// the page is not up yet.
func scrapeCounter(url, name string) int { return int(scrapeFloat(url, name)) }

// scrapeFloat reads one sample (its name with any labels, as exposed); 0
// when the page is not up yet.
func scrapeFloat(url, name string) float64 { return scrapeFloats(url, name)[0] }

// scrapeFloats reads several samples from one scrape, so that they are
// consistent with each other (a histogram's count and a bucket read in two
// scrapes can disagree by the observations made in between).
func scrapeFloats(url string, names ...string) []float64 {
	out := make([]float64, len(names))
	resp, err := scrapeClient.Get(url)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		for i, name := range names {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					out[i] = f
				}
			}
		}
	}
	return out
}

// vmHWM is a process's peak resident set size in MiB, from /proc.
func vmHWM(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			fields := strings.Fields(v)
			if len(fields) > 0 {
				kb, _ := strconv.ParseFloat(fields[0], 64)
				return kb / 1024
			}
		}
	}
	return 0
}
