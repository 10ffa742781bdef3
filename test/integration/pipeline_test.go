package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/outbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
)

// stageB's duplicate window is short, so the events a killed relay published
// and a second relay publishes again land in the stream twice: then only
// stage B's inbox stands between them and a double effect.
const stageBDuplicateWindow = 200 * time.Millisecond

// TestPipelineRelayKilledBetweenPublishAndMark runs a two-stage pipeline on
// real NATS JetStream and PostgreSQL: stage A consumes orders (20%
// duplicates) into an upsert and emits one event per new message through the
// outbox; stage B consumes those events (id = Nats-Msg-Id) into an append.
// The first relay dies after the broker confirmed a batch and before it was
// marked sent; a second relay, started after the stream's duplicate window,
// publishes the unmarked rows again with the same ids. B's table must hold
// exactly one row per original order id.
func TestPipelineRelayKilledBetweenPublishAndMark(t *testing.T) {
	const unique = 1000
	in := newJetStream(t, 2*time.Second)
	mid := newJetStream(t, 2*time.Second)
	shortenDuplicateWindow(t, mid)
	db := newPipelineDatabase(t)
	a := stageAConfig(in.sourceConfig(), dsnEnvFor(t, db), mid.subject+".projected", config.EmitAlways)
	b := stageBConfig(mid.sourceConfig(), a.Sink.DSNEnv)
	migrateInbox(t, db, a)
	migrateInbox(t, db, b)

	msgs := withDuplicates(keyedEvents(unique, 50), dupShare, rand.New(rand.NewPCG(3, 4)))
	in.publish(t, msgs)
	stageA := startRunner(t, a, db, "stage-a")
	stageB := startRunner(t, b, db, "stage-b")

	var batches atomic.Int32
	killed := errors.New("killed between publish and mark-sent")
	first := startRelay(t, a, db, func() error {
		if batches.Add(1) == 3 {
			return killed
		}
		return nil
	})
	waitSettled(t, len(msgs), 60*time.Second, stageA)
	if err := first.wait(t); !errors.Is(err, killed) {
		t.Fatalf("first relay ended with %v, want the injected kill", err)
	}
	unsent := db.queryInt(t, "SELECT count(*) FROM app.inbox_projector_outbox WHERE sent_at IS NULL")
	if unsent == 0 {
		t.Fatal("the killed relay left no unsent row: the failpoint did not hit a published, unmarked batch")
	}
	publishedBefore := streamMessages(t, mid)
	time.Sleep(2 * stageBDuplicateWindow) // let the stream forget the ids, so only B's inbox dedupes

	second := startRelay(t, a, db, nil)
	waitFor(t, 60*time.Second, "the outbox to drain", func() error {
		if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_projector_outbox WHERE sent_at IS NULL"); n != 0 {
			return fmt.Errorf("%d unsent", n)
		}
		return nil
	})
	second.stop(t)
	published := streamMessages(t, mid)
	if published <= unique {
		t.Fatalf("stage B's stream holds %d events for %d orders: the republished batch never reached it (before the second relay: %d)", published, unique, publishedBefore)
	}
	waitSettled(t, published, 60*time.Second, stageB)
	stageB.stop(t)
	stageA.stop(t)

	rows := db.queryInt(t, "SELECT count(*) FROM app.projected")
	ids := db.queryInt(t, "SELECT count(DISTINCT source_id) FROM app.projected")
	doubled := db.queryInt(t, "SELECT count(*) FROM (SELECT source_id FROM app.projected GROUP BY 1 HAVING count(*) > 1) d")
	inboxB := db.queryInt(t, "SELECT count(*) FROM app.inbox_audit")
	inboxBDistinct := db.queryInt(t, "SELECT count(DISTINCT message_id) FROM app.inbox_audit")
	t.Logf("PIPELINE kills=1 published=%d unique=%d final=%d doubled=%d lost=%d", published, unique, ids, doubled, unique-ids)
	if rows != unique || ids != unique || doubled != 0 {
		t.Errorf("stage B: %d rows over %d original ids (%d doubled), want exactly %d, one each", rows, ids, doubled, unique)
	}
	if inboxB != unique || inboxBDistinct != unique {
		t.Errorf("stage B's inbox: %d rows, %d distinct ids; want %d of each", inboxB, inboxBDistinct, unique)
	}
	if dups := stageB.duplicates(); dups < published-unique {
		t.Errorf("stage B skipped %d duplicates, want at least the %d republished events", dups, published-unique)
	}
	for _, q := range []string{"SELECT count(*) FROM app.inbox_projector_dead_letters", "SELECT count(*) FROM app.inbox_audit_dead_letters"} {
		if n := db.queryInt(t, q); n != 0 {
			t.Errorf("%s = %d, want no dead letters", q, n)
		}
	}
}

// TestEmitWhenChanged: with emit.when: Changed, an upsert refused by the
// sequence gate writes no outbox row; with Always it does.
func TestEmitWhenChanged(t *testing.T) {
	for _, when := range []string{config.EmitChanged, config.EmitAlways} {
		t.Run(when, func(t *testing.T) {
			in := newJetStream(t, 2*time.Second)
			db := newDatabase(t)
			db.exec(t, "CREATE SCHEMA app", "CREATE TABLE app.orders (order_id text PRIMARY KEY, status text, version int)")
			a := stageAConfig(in.sourceConfig(), dsnEnvFor(t, db), "unused.subject", when)
			migrateInbox(t, db, a)
			stageA := startRunner(t, a, db, "stage-a")
			// One at a time, so each is its own batch: v1 and v3 change
			// the row, v2 arrives after v3 and is refused.
			for i, v := range []int{1, 3, 2} {
				in.publish(t, []outgoing{event{ID: fmt.Sprintf("o1-v%d", v), Key: "o1", Version: v, Status: "s"}.outgoing()})
				waitSettled(t, i+1, 30*time.Second, stageA)
			}
			stageA.stop(t)
			if got := db.queryInt(t, "SELECT version FROM app.orders WHERE order_id = 'o1'"); got != 3 {
				t.Fatalf("stored version %d, want 3", got)
			}
			want := map[string]int{config.EmitChanged: 2, config.EmitAlways: 3}[when]
			if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_projector_outbox"); n != want {
				t.Errorf("%d outbox rows, want %d", n, want)
			}
			stale := db.queryInt(t, "SELECT count(*) FROM app.inbox_projector_outbox WHERE source_id = 'o1-v2'")
			if wantStale := map[string]int{config.EmitChanged: 0, config.EmitAlways: 1}[when]; stale != wantStale {
				t.Errorf("%d outbox rows for the refused update, want %d", stale, wantStale)
			}
			wantID := outbox.EventID("o1-v3", "natsJetStream:unused.subject")
			if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_projector_outbox WHERE event_id = $1", wantID); n != 1 {
				t.Errorf("no outbox row with the derived id %s", wantID)
			}
		})
	}
}

// newPipelineDatabase is a PostgreSQL database with the two stages' tables
// (sinkDB.createPipeline): stage A's orders projection and stage B's
// append-only projected events (no unique key, so an event applied twice
// is a second row; hdr holds a header).
func newPipelineDatabase(t *testing.T) *database {
	t.Helper()
	db := newDatabase(t)
	db.createPipeline(t)
	return db
}

// keyedEvents are n orders over keys entities, each key's versions rising.
func keyedEvents(n, keys int) []event {
	out := make([]event, n)
	for i := range out {
		out[i] = event{ID: fmt.Sprintf("ord-%06d", i), Key: fmt.Sprintf("k%03d", i%keys), Version: i/keys + 1, Status: "placed", N: i}
	}
	return out
}

func stageAConfig(src config.Source, dsnEnv, subject, when string) *config.Config {
	cfg := &config.Config{
		Name:   "integration/projector",
		Source: src,
		Message: config.Message{ID: config.Extractor{JSONPath: "$.id"},
			Entity: &config.Entity{Key: config.Extractor{JSONPath: "$.key"}, Sequence: config.Extractor{JSONPath: "$.version"}}},
		Sink: config.Sink{DSNEnv: dsnEnv, Schema: "app", InboxTable: "inbox_projector", Layout: config.LayoutTable,
			Effect: config.Effect{Upsert: &config.Upsert{Table: "orders", Key: []string{"order_id"}, SequenceColumn: "version",
				Columns: map[string]string{"order_id": "$.key", "status": "$.status", "version": "$.version"}}}},
		Emit: &config.Emit{NATSJetStream: &config.EmitJetStream{URL: natsURL, Subject: subject}, When: when,
			Payload: map[string]string{"sourceId": "@messageId", "key": "$.key", "version": "$.version"}},
		Delivery: config.Delivery{BatchSize: 100, MaxWait: config.Duration{Duration: 100 * time.Millisecond},
			BackoffInitial: config.Duration{Duration: 20 * time.Millisecond}, BackoffMax: config.Duration{Duration: 500 * time.Millisecond}},
		Retention: config.Retention{Mode: "Explicit", Window: config.Duration{Duration: time.Hour}},
	}
	cfg.Default()
	return cfg
}

func stageBConfig(src config.Source, dsnEnv string) *config.Config {
	cfg := &config.Config{
		Name:    "integration/audit",
		Source:  src,
		Message: config.Message{ID: config.Extractor{Header: "Nats-Msg-Id"}},
		Sink: config.Sink{DSNEnv: dsnEnv, Schema: "app", InboxTable: "inbox_audit", Layout: config.LayoutTable,
			Effect: config.Effect{Append: &config.Append{Table: "projected", Columns: map[string]string{
				"event_id": "@messageId", "source_id": "$.sourceId", "version": "$.version",
			}}}},
		Delivery: config.Delivery{BatchSize: 100, MaxWait: config.Duration{Duration: 100 * time.Millisecond},
			BackoffInitial: config.Duration{Duration: 20 * time.Millisecond}, BackoffMax: config.Duration{Duration: 500 * time.Millisecond}},
		Retention: config.Retention{Mode: "Explicit", Window: config.Duration{Duration: time.Hour}},
	}
	cfg.Default()
	return cfg
}

func shortenDuplicateWindow(t *testing.T, b *jetStreamBroker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.Duplicates = stageBDuplicateWindow
	if _, err := b.js.UpdateStream(ctx, sc); err != nil {
		t.Fatalf("shortening the duplicate window: %v", err)
	}
}

func streamMessages(t *testing.T, b *jetStreamBroker) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, b.stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return int(info.State.Msgs)
}

// relayRunner is one replica's outbox relay driven in-process.
type relayRunner struct {
	cancel  context.CancelFunc
	done    chan error
	metrics *outbox.Metrics
}

func startRelay(t *testing.T, cfg *config.Config, db *database, afterPublish func() error) *relayRunner {
	t.Helper()
	pool := db.newPool(t)
	store, err := inbox.ForConfig(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := outbox.NewPublisher(cfg.Emit)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)
	metrics, err := outbox.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r := &outbox.Relay{Store: postgres.Wrap(pool, store), DB: postgres.New(pool), Publisher: pub, Metrics: metrics, Log: testLogger(t),
		BatchSize: 50, Workers: 2, Poll: 50 * time.Millisecond,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 500 * time.Millisecond, AfterPublish: afterPublish}
	ctx, cancel := context.WithCancel(context.Background())
	rr := &relayRunner{cancel: cancel, done: make(chan error, 1), metrics: metrics}
	go func() { rr.done <- r.Run(ctx) }()
	t.Cleanup(cancel)
	return rr
}

func (r *relayRunner) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("the relay did not end within 60s")
		return nil
	}
}

func (r *relayRunner) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	if err := r.wait(t); err != nil {
		t.Errorf("relay: %v", err)
	}
	if n := testutil.ToFloat64(r.metrics.Published); n == 0 {
		t.Error("idc_outbox_published_total stayed 0")
	}
}

// relayFailpoint is the pipeline with the real binary as stage A, armed with
// IDC_FAILPOINT=relay-after-publish-before-mark: it SIGKILLs itself once the
// stream confirmed its relay's first batch and before the batch is marked
// sent. Restarted, it publishes those rows again (after stage B's duplicate
// window); stage B applies each original order once.
func relayFailpoint(t *testing.T, bin string) {
	const unique = 500
	in := newJetStream(t, 2*time.Second)
	mid := newJetStream(t, 2*time.Second)
	shortenDuplicateWindow(t, mid)
	db := newPipelineDatabase(t)
	a := stageAConfig(in.sourceConfig(), dsnEnvFor(t, db), mid.subject+".projected", config.EmitAlways)
	b := stageBConfig(mid.sourceConfig(), a.Sink.DSNEnv)
	migrateInbox(t, db, b)
	in.publish(t, withDuplicates(keyedEvents(unique, 20), dupShare, rand.New(rand.NewPCG(5, 6))))

	p := startBinary(t, bin, a, "IDC_FAILPOINT=relay-after-publish-before-mark")
	st := p.wait(t, 60*time.Second)
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("exit state %s, want killed by SIGKILL", st)
	}
	unsent := db.queryInt(t, "SELECT count(*) FROM app.inbox_projector_outbox WHERE sent_at IS NULL")
	if first := streamMessages(t, mid); first == 0 || unsent == 0 {
		t.Fatalf("after the failpoint: %d events in stage B's stream, %d outbox rows unsent; want a published batch left unmarked", first, unsent)
	}
	time.Sleep(2 * stageBDuplicateWindow) // let the stream forget the ids, so only B's inbox dedupes

	p2 := startBinary(t, bin, a)
	waitFor(t, 60*time.Second, "stage A to drain its input and its outbox", func() error {
		if err := in.drained(context.Background()); err != nil {
			return err
		}
		if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_projector_outbox WHERE sent_at IS NULL"); n != 0 {
			return fmt.Errorf("%d outbox rows unsent", n)
		}
		return nil
	})
	expectCleanExit(t, p2, p2.terminate(t))
	published := streamMessages(t, mid)
	if published <= unique {
		t.Fatalf("stage B's stream holds %d events for %d orders: the batch published before the kill was not published again", published, unique)
	}
	stageB := startRunner(t, b, db, "stage-b")
	waitSettled(t, published, 60*time.Second, stageB)
	stageB.stop(t)
	rows := db.queryInt(t, "SELECT count(*) FROM app.projected")
	ids := db.queryInt(t, "SELECT count(DISTINCT source_id) FROM app.projected")
	t.Logf("PIPELINE kills=1 published=%d unique=%d final=%d doubled=%d lost=%d", published, unique, ids, rows-ids, unique-ids)
	if rows != unique || ids != unique {
		t.Errorf("stage B: %d rows over %d original ids, want exactly %d, one each", rows, ids, unique)
	}
}

func testutilPublished(r *relayRunner) float64 { return testutil.ToFloat64(r.metrics.Published) }
