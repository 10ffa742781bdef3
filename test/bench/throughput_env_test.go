package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	nc   *nats.Conn
	js   jetstream.JetStream
	dir  string
	runs int
	// stream is the published workload's stream (jetStreamStream).
	stream string
	// floorBin is the floor consumer, built on first use.
	floorBin string
	// slice, when set, is the measured window of a latency row (the
	// interleaved floor pairs' short slices).
	slice time.Duration
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
