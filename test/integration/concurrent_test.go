package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// TestConcurrentReplicas runs three replicas on one durable consumer (and on
// one Redis group): duplicates published back to back land in different
// replicas' batches at the same time, and the inbox primary key settles
// every race to exactly one effect.
func TestConcurrentReplicas(t *testing.T) {
	for _, b := range []broker{newJetStream(t, 30*time.Second), newRedis(t, 30*time.Second)} {
		t.Run(b.name(), func(t *testing.T) {
			db := newDatabase(t)
			db.exec(t, "CREATE SCHEMA app", effectsTable)
			cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
			cfg.Delivery.BatchSize = 50 // smaller batches interleave more
			migrateInbox(t, db, cfg)
			msgs := withDuplicates(plainEvents(uniqueEvents), dupShare, rand.New(rand.NewPCG(3, 4)))
			b.publish(t, msgs)
			rs := []*runner{startRunner(t, cfg, db, "replica-0"), startRunner(t, cfg, db, "replica-1"), startRunner(t, cfg, db, "replica-2")}
			waitSettled(t, len(msgs), 60*time.Second, rs...)
			dups := 0
			for _, r := range rs {
				r.stop(t)
				dups += r.duplicates()
				if r.settled() == 0 {
					t.Errorf("replica %s settled nothing: the test did not exercise concurrency", r.name)
				}
			}
			checkExactlyOnce(t, db, b, uniqueEvents)
			if want := len(msgs) - uniqueEvents; dups != want {
				t.Errorf("replicas skipped %d duplicates in total, want %d", dups, want)
			}
		})
	}
}

// TestSequenceGate publishes 40 keys × 25 versions shuffled (plus 10%
// re-sent duplicates) into an upsert gated on the version column. The table
// ends at the highest version of every key; a trigger logs every row change
// the database actually made, proving each went forward; the consumer's
// stale counter equals the deliveries the gate refused.
func TestSequenceGate(t *testing.T) {
	const keys, versions = 40, 25
	b := newJetStream(t, 30*time.Second)
	db := newDatabase(t)
	createGatedOrders(t, db)
	cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
	gateOrders(cfg)
	cfg.Delivery.BatchSize = 60
	migrateInbox(t, db, cfg)

	rng := rand.New(rand.NewPCG(5, 6))
	var events []event
	for k := range keys {
		for v := 1; v <= versions; v++ {
			events = append(events, event{ID: fmt.Sprintf("k%02d-v%02d", k, v), Key: fmt.Sprintf("k%02d", k), Version: v, Status: fmt.Sprintf("s%02d", v)})
		}
	}
	rng.Shuffle(len(events), func(i, j int) { events[i], events[j] = events[j], events[i] })
	msgs := withDuplicates(events, 0.1, rng)
	b.publish(t, msgs)

	r := startRunner(t, cfg, db, "replica-0")
	waitSettled(t, len(msgs), 60*time.Second, r)
	r.stop(t)

	wrong := db.queryInt(t, "SELECT count(*) FROM app.orders WHERE version <> $1 OR status <> $2", versions, fmt.Sprintf("s%02d", versions))
	if n := db.queryInt(t, "SELECT count(*) FROM app.orders"); n != keys || wrong != 0 {
		t.Errorf("%d rows, %d not at version %d: want every key at its highest version", n, wrong, versions)
	}
	if back := db.queryInt(t, "SELECT count(*) FROM app.changes WHERE old_version >= new_version"); back != 0 {
		t.Errorf("%d row changes went backwards or sideways through the gate", back)
	}
	applied := db.queryInt(t, "SELECT count(*) FROM app.changes")
	dups := len(msgs) - len(events)
	if r.duplicates() != dups {
		t.Errorf("duplicates skipped = %d, want %d", r.duplicates(), dups)
	}
	if want := len(events) - applied; r.stale() != want || want == 0 {
		t.Errorf("idc_stale_refused_total = %d, want %d (unique deliveries %d - row changes %d), and > 0", r.stale(), want, len(events), applied)
	}
	t.Logf("%d messages (%d duplicates): %d row changes applied, %d refused as stale", len(msgs), dups, applied, r.stale())
	checkDrained(t, b)
}

func checkDrained(t *testing.T, b broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waitFor(t, 15*time.Second, b.name()+" to report every message acknowledged", func() error { return b.drained(ctx) })
}

// TestTerminatedConnectionsUnderLoad kills every connection of the
// consumer's database with pg_terminate_backend every 50ms while it works
// (an operator, a failover, a proxy restart): some transactions die before
// COMMIT, some connections die right after it. Nothing is lost and nothing
// is applied twice.
func TestTerminatedConnectionsUnderLoad(t *testing.T) {
	b := newJetStream(t, 30*time.Second)
	db := newDatabase(t)
	db.exec(t, "CREATE SCHEMA app", effectsTable)
	cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
	cfg.Delivery.BatchSize = 50
	migrateInbox(t, db, cfg)
	const unique = 4000
	msgs := withDuplicates(plainEvents(unique), dupShare, rand.New(rand.NewPCG(7, 8)))
	b.publish(t, msgs)

	admin, err := pgx.Connect(context.Background(), pgtest.AdminDSN())
	if err != nil {
		t.Fatalf("PostgreSQL is required: %v", err)
	}
	defer admin.Close(context.Background())
	var rounds, killed atomic.Int64
	stopKiller := make(chan struct{})
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		for {
			select {
			case <-stopKiller:
				return
			// Often: with transactions in flight overlapping, the load
			// is over in about a second.
			case <-time.After(20 * time.Millisecond):
			}
			n, err := db.terminateBackends(context.Background(), admin)
			if err == nil && n > 0 {
				rounds.Add(1)
				killed.Add(int64(n))
			}
		}
	}()
	r := startRunner(t, cfg, db, "replica-0")
	// The checks' own pool is killed too; the wait tolerates that by
	// reading the consumer's metrics, not the database.
	waitSettled(t, len(msgs), 120*time.Second, r)
	close(stopKiller)
	<-killerDone
	r.stop(t)
	if rounds.Load() < 10 {
		t.Fatalf("only %d rounds terminated a backend: the test did not exercise connection loss", rounds.Load())
	}
	db.pool.Reset() // drop connections the killer left dead
	checkExactlyOnce(t, db, b, unique)
	t.Logf("%d messages (%d unique) settled while %d backends were terminated in %d rounds", len(msgs), unique, killed.Load(), rounds.Load())
}

// createGatedOrders creates app.orders (one row per key, its version) and
// app.changes, where a trigger logs every row change the database made.
func createGatedOrders(t *testing.T, db *database) {
	t.Helper()
	db.exec(t, "CREATE SCHEMA app",
		"CREATE TABLE app.orders (key text PRIMARY KEY, version int NOT NULL, status text NOT NULL)",
		"CREATE TABLE app.changes (key text, old_version int, new_version int)",
		`CREATE FUNCTION app.log_change() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		   INSERT INTO app.changes VALUES (NEW.key, CASE WHEN TG_OP = 'UPDATE' THEN OLD.version END, NEW.version);
		   RETURN NEW;
		 END $$`,
		"CREATE TRIGGER log_change AFTER INSERT OR UPDATE ON app.orders FOR EACH ROW EXECUTE FUNCTION app.log_change()")
}

// gateOrders makes cfg upsert app.orders through the sequence gate ($.key,
// $.version).
func gateOrders(cfg *config.Config) {
	cfg.Message.Entity = &config.Entity{Key: config.Extractor{JSONPath: "$.key"}, Sequence: config.Extractor{JSONPath: "$.version"}}
	cfg.Sink.Effect = config.Effect{Upsert: &config.Upsert{Table: "orders", Key: []string{"key"}, SequenceColumn: "version",
		Columns: map[string]string{"key": "$.key", "version": "$.version", "status": "$.status"}}}
}
