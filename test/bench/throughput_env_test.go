package bench

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/internal/testbin"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

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
	dir  string
	runs int
	// nats is the NATS server the JetStream rows run on: the run's first
	// (natsURL) but inside onNATS.
	nats *natsConn
	// natsConns are the connections to the run's servers, opened on
	// first use.
	natsConns map[*natstest.Server]*natsConn
	// floorBin is the floor consumer, built on first use.
	floorBin string
	// slice, when set, is the measured window of a latency row (the
	// interleaved floor pairs' short slices).
	slice time.Duration
	// sink is where the rows' inboxes and tables are: pgSink (the
	// PostgreSQL database above) but for the MariaDB rows (onSink).
	sink benchSink
	// mariadb is the MariaDB sink, opened by the first MariaDB row.
	mariadb *mariaSink
}

func newThroughputEnv(b *testing.B, w *workload) *throughputEnv {
	b.Helper()
	if len(natsServers) == 0 {
		b.Fatal("no NATS server: TestMain opens them when a benchmark runs")
	}
	t := &throughputEnv{w: w, bin: testbin.Build(b, testbin.RuntimePackage, "idc-runtime"), dsn: newDatabase(b), dir: b.TempDir(),
		natsConns: map[*natstest.Server]*natsConn{}}
	t.sink = pgSink{t}
	var err error
	if t.pool, err = pgxpool.New(context.Background(), t.dsn); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(t.pool.Close)
	t.nats = t.natsConnTo(b, natsServers[0])
	return t
}

// schema creates a fresh schema (a database on MariaDB) with the orders
// table for one row, on the current sink.
func (t *throughputEnv) schema(b *testing.B) string {
	b.Helper()
	t.runs++
	s := t.sink.namespace(t.runs)
	t.sink.create(b, s)
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
	rows, notLatest, inboxRows := t.sink.counts(b, schema, versions)
	if rows != keys || notLatest != 0 || inboxRows != t.w.unique {
		b.Fatalf("schema %s: %d rows (want %d), %d not at version %d, %d inbox rows (want %d)",
			schema, rows, keys, notLatest, versions, inboxRows, t.w.unique)
	}
}

// checkPartial is checkResult for a row that stopped after the first
// part of the stream: the inbox holds some of the unique ids (none
// twice: its key), and every key with a claimed id has its row, at the
// highest version claimed for it (the gate and the claim committed
// together), and no other key has one.
func (t *throughputEnv) checkPartial(b *testing.B, schema string) {
	b.Helper()
	defer t.dropSchema(b, schema)
	rows, claimedKeys, wrong, inboxRows := t.sink.claimed(b, schema)
	if inboxRows == 0 || inboxRows > t.w.unique || rows != claimedKeys || wrong != 0 {
		b.Fatalf("schema %s: %d inbox rows (want 1..%d), %d rows for %d claimed keys, %d not at the highest claimed version",
			schema, inboxRows, t.w.unique, rows, claimedKeys, wrong)
	}
}

func (t *throughputEnv) dropSchema(b *testing.B, schema string) {
	b.Helper()
	t.sink.drop(b, schema)
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
