// Package bench compares, on the same JetStream stream content, this
// project's batched inbox with the textbook per-message inbox and with no
// deduplication at all (the upper bound), all writing the same gated upsert
// into PostgreSQL. Run it with `make bench`. It needs PostgreSQL and NATS
// JetStream on loopback (the current nats-server, which TestMain starts,
// and the machine's: nats_test.go) and fails (never skips) when either is
// down.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/consumer"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
	"github.com/idempotency-dev/idc-operator/runtime/source"
	jsadapter "github.com/idempotency-dev/idc-operator/runtime/source/jetstream"
)

const (
	adminDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

	// keys × versions unique events plus 20% re-sent duplicates: 100,000
	// messages on the stream.
	keys     = 20000
	versions = 4
	dupShare = 0.2
	// perMessageLimit: the per-message mode consumes only the first part of
	// the stream (its rate is reported for what it consumed): at one fsync'd
	// COMMIT per message it runs at a few hundred messages per second here,
	// and the whole bench must stay near a minute.
	perMessageLimit = 10000
	// warmupMessages go through every mode's code path before any timing,
	// so no mode pays for cold connections, statement preparation or caches.
	warmupMessages = 2000
	batchSize      = 500
	maxWait        = 100 * time.Millisecond
	modeTimeout    = 3 * time.Minute
)

// result of one mode.
type result struct {
	mode    string
	msgs    int
	elapsed time.Duration
}

func (r result) rate() float64 { return float64(r.msgs) / r.elapsed.Seconds() }

// BenchmarkInboxModes prints one BENCH line per mode and the two ratios.
// The machine is shared (two cores, other test suites running), so the two
// fast modes run twice each, alternating (batched, nodedup, nodedup,
// batched), and each reports its better run; every run is logged.
func BenchmarkInboxModes(b *testing.B) {
	e := setup(b)
	for range b.N {
		e.warmUp(b)
		b1 := e.runBatched(b, "batched_1", e.total)
		n1 := e.runNoDedup(b, "nodedup_1", e.total)
		n2 := e.runNoDedup(b, "nodedup_2", e.total)
		b2 := e.runBatched(b, "batched_2", e.total)
		perMessage := e.runPerMessage(b, "per_message", perMessageLimit)
		// The last runs of both fast modes consumed the whole stream into
		// freshly truncated tables: their final states must agree.
		e.checkSameState(b)
		batched, nodedup := faster(b1, b2), faster(n1, n2)
		for _, r := range []result{b1, b2, n1, n2} {
			b.Logf("run mode=%s msgs=%d seconds=%.3f msgs_per_s=%.0f", r.mode, r.msgs, r.elapsed.Seconds(), r.rate())
		}
		for _, r := range []result{batched, perMessage, nodedup} {
			fmt.Printf("BENCH mode=%s msgs=%d seconds=%.3f msgs_per_s=%.0f nats=%s\n", r.mode, r.msgs, r.elapsed.Seconds(), r.rate(), e.natsVersion)
			b.ReportMetric(r.rate(), r.mode+"_msgs/s")
		}
		fmt.Printf("RATIO batched_vs_per_message=%.2f\n", batched.rate()/perMessage.rate())
		fmt.Printf("RATIO batched_vs_nodedup=%.2f\n", batched.rate()/nodedup.rate())
	}
}

func faster(a, b result) result {
	if b.elapsed < a.elapsed {
		return b
	}
	return a
}

// warmUp runs every mode over the start of the stream, untimed.
func (e *env) warmUp(b *testing.B) {
	b.Helper()
	e.runBatched(b, "warmup_batched", warmupMessages)
	e.runNoDedup(b, "warmup_nodedup", warmupMessages)
	e.runPerMessage(b, "warmup_per_message", warmupMessages/10)
}

// env is the stream (published once) and the database shared by the modes.
type env struct {
	js     jetstream.JetStream
	stream string
	total  int // messages on the stream
	// natsVersion is the NATS server's (natsURL's).
	natsVersion string
	dsn         string
	pool        *pgxpool.Pool
}

func setup(b *testing.B) *env {
	b.Helper()
	e := &env{dsn: newDatabase(b)}
	var err error
	if e.pool, err = pgxpool.New(context.Background(), e.dsn); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.pool.Close)
	for _, schema := range []string{"batched", "per_message", "nodedup"} {
		e.exec(b, "CREATE SCHEMA "+schema,
			"CREATE TABLE "+schema+".orders (key text PRIMARY KEY, version int NOT NULL, status text NOT NULL, amount numeric NOT NULL)")
	}
	e.exec(b, `CREATE TABLE per_message.inbox (message_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())`)
	e.publish(b)
	return e
}

func (e *env) exec(b *testing.B, stmts ...string) {
	b.Helper()
	for _, s := range stmts {
		if _, err := e.pool.Exec(context.Background(), s); err != nil {
			b.Fatalf("running %q: %v", s, err)
		}
	}
}

type order struct {
	ID      string `json:"id"`
	Key     string `json:"key"`
	Version int    `json:"version"`
	Status  string `json:"status"`
	Amount  int    `json:"amount"`
}

// publish puts keys×versions events, shuffled, plus 20% re-sent duplicates
// (the same id and body as a new stream message) on a new stream.
func (e *env) publish(b *testing.B) {
	b.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		b.Fatalf("NATS JetStream at %s is required for the benchmark: %v", natsURL, err)
	}
	b.Cleanup(nc.Close)
	e.natsVersion = nc.ConnectedServerVersion()
	if e.js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4000)); err != nil {
		b.Fatal(err)
	}
	e.stream = fmt.Sprintf("IDC_BENCH_%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.stream + ".>"}}); err != nil {
		b.Fatalf("creating stream: %v", err)
	}
	b.Cleanup(func() { _ = e.js.DeleteStream(context.Background(), e.stream) })
	bodies := benchBodies()
	for _, body := range bodies {
		if _, err := e.js.PublishAsync(e.stream+".orders", body); err != nil {
			b.Fatalf("publishing: %v", err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal("publishing did not complete")
	}
	e.total = len(bodies)
}

// benchBodies is the stream content: keys x versions events, shuffled, plus
// 20% re-sent duplicates (the same id and body as a new stream message).
func benchBodies() [][]byte {
	rng := rand.New(rand.NewPCG(42, 7))
	var bodies [][]byte
	for k := range keys {
		for v := 1; v <= versions; v++ {
			body, _ := json.Marshal(order{ID: fmt.Sprintf("k%05d-v%d", k, v), Key: fmt.Sprintf("k%05d", k), Version: v,
				Status: fmt.Sprintf("s%d", v), Amount: k*10 + v})
			bodies = append(bodies, body)
		}
	}
	rng.Shuffle(len(bodies), func(i, j int) { bodies[i], bodies[j] = bodies[j], bodies[i] })
	dups := int(float64(len(bodies)) * dupShare / (1 - dupShare))
	for range dups {
		// A re-send comes some time after the original.
		i := rng.IntN(len(bodies))
		bodies = append(bodies, bodies[i])
	}
	rng.Shuffle(len(bodies)-keys*versions, func(i, j int) {
		o := keys * versions
		bodies[o+i], bodies[o+j] = bodies[o+j], bodies[o+i]
	})
	return bodies
}

// jetStreamSource opens the project's JetStream adapter on a new durable
// consumer of the stream, so every mode reads the whole stream.
func (e *env) jetStreamSource(b *testing.B, durable string) (*config.JetStream, source.Source) {
	b.Helper()
	cfg := &config.JetStream{URL: natsURL, Stream: e.stream, Consumer: durable}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := e.js.CreateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Minute, MaxAckPending: 20000,
	})
	if err != nil {
		b.Fatalf("creating consumer %s: %v", durable, err)
	}
	src, err := jsadapter.New(ctx, cfg, logr.Discard())
	if err != nil {
		b.Fatalf("opening the JetStream source: %v", err)
	}
	b.Cleanup(func() { _ = src.Close() })
	return cfg, src
}

// upsertConfig is the effect every mode applies: the latest state per key
// behind the sequence gate.
func upsertConfig() (config.Effect, *config.Entity) {
	return config.Effect{Upsert: &config.Upsert{Table: "orders", Key: []string{"key"}, SequenceColumn: "version",
			Columns: map[string]string{"key": "$.key", "version": "$.version", "status": "$.status", "amount": "$.amount"}}},
		&config.Entity{Key: config.Extractor{JSONPath: "$.key"}, Sequence: config.Extractor{JSONPath: "$.version"}}
}

// runBatched is this project's consumer: batch claim + set-based upsert in
// one transaction per batch, ack after commit.
func (e *env) runBatched(b *testing.B, durable string, limit int) result {
	b.Helper()
	e.exec(b, "DROP TABLE IF EXISTS batched.inbox, batched.inbox_dead_letters, batched.inbox_prune_runs, batched.inbox_meta",
		"TRUNCATE batched.orders")
	js, src := e.jetStreamSource(b, durable)
	eff, entity := upsertConfig()
	cfg := &config.Config{
		Name: "bench/batched", Source: config.Source{NATSJetStream: js},
		Message:  config.Message{ID: config.Extractor{JSONPath: "$.id"}, Entity: entity},
		Sink:     config.Sink{DSNEnv: "UNUSED", Schema: "batched", InboxTable: "inbox", Layout: config.LayoutTable, Effect: eff},
		Delivery: config.Delivery{BatchSize: batchSize, MaxWait: config.Duration{Duration: maxWait}},
	}
	cfg.Default()
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	store, err := inbox.New(e.pool, cfg.Sink)
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	metrics, err := consumer.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	c, err := consumer.New(src, postgres.New(e.pool), cfg, metrics, logr.Discard())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(ctx) }()
	deadline := time.After(modeTimeout)
	for int(testutil.ToFloat64(metrics.Messages)) < limit {
		select {
		case <-deadline:
			cancel()
			b.Fatalf("batched: settled %v of %d messages in %s", testutil.ToFloat64(metrics.Messages), limit, modeTimeout)
		case <-time.After(2 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return result{mode: "batched", msgs: int(testutil.ToFloat64(metrics.Messages)), elapsed: elapsed}
}

// runPerMessage is the textbook inbox: per message BEGIN; INSERT INTO inbox
// ... ON CONFLICT DO NOTHING; the upsert only if the id was new; COMMIT;
// ack. It fetches in batches like the others (fetching is not what is
// compared) and acks each message right after its commit.
func (e *env) runPerMessage(b *testing.B, durable string, limit int) result {
	b.Helper()
	e.exec(b, "TRUNCATE per_message.orders, per_message.inbox")
	_, src := e.jetStreamSource(b, durable)
	upsert := `INSERT INTO per_message.orders AS cur (key, version, status, amount) VALUES ($1, $2, $3, $4)
		ON CONFLICT (key) DO UPDATE SET version = EXCLUDED.version, status = EXCLUDED.status, amount = EXCLUDED.amount
		WHERE cur.version < EXCLUDED.version`
	ctx := context.Background()
	n := 0
	start := time.Now()
	for n < limit {
		if time.Since(start) > modeTimeout {
			b.Fatalf("per_message: %d of %d messages in %s", n, limit, modeTimeout)
		}
		msgs, err := src.Fetch(ctx, min(batchSize, limit-n), maxWait)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range msgs {
			if err := e.processOne(ctx, upsert, m); err != nil {
				b.Fatal(err)
			}
			if err := m.Ref.(jetstream.Msg).Ack(); err != nil {
				b.Fatal(err)
			}
			n++
		}
	}
	elapsed := time.Since(start)
	return result{mode: "per_message", msgs: n, elapsed: elapsed}
}

func (e *env) processOne(ctx context.Context, upsert string, m source.Message) error {
	var o order
	if err := json.Unmarshal(m.Body, &o); err != nil {
		return fmt.Errorf("while decoding: %w", err)
	}
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO per_message.inbox (message_id) VALUES ($1) ON CONFLICT DO NOTHING`, o.ID)
		if err != nil {
			return fmt.Errorf("while claiming: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return nil // a duplicate
		}
		if _, err := tx.Exec(ctx, upsert, o.Key, o.Version, o.Status, o.Amount); err != nil {
			return fmt.Errorf("while upserting: %w", err)
		}
		return nil
	})
}

// runNoDedup is at-least-once without an inbox: the same set-based gated
// upsert per batch (the project's effect code), no claim. It is the upper
// bound of what the batched inbox can reach.
func (e *env) runNoDedup(b *testing.B, durable string, limit int) result {
	b.Helper()
	e.exec(b, "TRUNCATE nodedup.orders")
	_, src := e.jetStreamSource(b, durable)
	effCfg, entity := upsertConfig()
	eff, err := effect.New(effCfg, "nodedup", entity)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	n := 0
	start := time.Now()
	for n < limit {
		if time.Since(start) > modeTimeout {
			b.Fatalf("nodedup: %d of %d messages in %s", n, limit, modeTimeout)
		}
		msgs, err := src.Fetch(ctx, batchSize, maxWait)
		if err != nil {
			b.Fatal(err)
		}
		if len(msgs) == 0 {
			continue
		}
		recs := make([]*extract.Message, len(msgs))
		for i, m := range msgs {
			recs[i] = extract.NewMessage(m)
		}
		err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			_, err := eff.Apply(ctx, tx, recs)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := src.Ack(ctx, msgs); err != nil {
			b.Fatal(err)
		}
		n += len(msgs)
	}
	return result{mode: "nodedup", msgs: n, elapsed: time.Since(start)}
}

// checkSameState fails the benchmark unless the batched inbox and the
// no-dedup run ended with the same table, holding the highest version of
// every key.
func (e *env) checkSameState(b *testing.B) {
	b.Helper()
	var diff, rows, notLatest int
	err := e.pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM ((TABLE batched.orders EXCEPT TABLE nodedup.orders) UNION ALL (TABLE nodedup.orders EXCEPT TABLE batched.orders)) d),
		(SELECT count(*) FROM batched.orders),
		(SELECT count(*) FROM batched.orders WHERE version <> $1)`, versions).Scan(&diff, &rows, &notLatest)
	if err != nil {
		b.Fatal(err)
	}
	if diff != 0 || rows != keys || notLatest != 0 {
		b.Fatalf("final state differs: %d rows differ between batched and nodedup; batched has %d rows (want %d), %d not at version %d",
			diff, rows, keys, notLatest, versions)
	}
}

// newDatabase creates a database private to the run, dropped at the end.
func newDatabase(b *testing.B) string {
	b.Helper()
	return newDatabaseWith(b, "")
}

// newDatabaseWith creates the database with options after CREATE DATABASE
// name (a locale, say).
func newDatabaseWith(b *testing.B, options string) string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		b.Fatalf("PostgreSQL is required for the benchmark and is unreachable: %v", err)
	}
	defer admin.Close(context.Background())
	name := fmt.Sprintf("idc_bench_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" "+options); err != nil {
		b.Fatalf("creating database: %v", err)
	}
	b.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), adminDSN)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return fmt.Sprintf("postgres://postgres@127.0.0.1:5432/%s?sslmode=disable", name)
}
