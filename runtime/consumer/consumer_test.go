package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

func testConfig(t *testing.T, layout config.Layout) *config.Config {
	t.Helper()
	c := &config.Config{
		Name:    "test/orders",
		Source:  config.Source{NATSJetStream: &config.JetStream{URL: "nats://unused", Stream: "S", Consumer: "c"}},
		Message: config.Message{ID: config.Extractor{JSONPath: "$.id"}},
		Sink: config.Sink{DSNEnv: "UNUSED", Schema: "app", InboxTable: "inbox_orders", Layout: layout,
			Effect: config.Effect{Append: &config.Append{Table: "effects", Columns: map[string]string{
				"message_id": "@messageId", "n": "$.n",
			}}}},
		Delivery: config.Delivery{BatchSize: 37, MaxWait: config.Duration{Duration: 20 * time.Millisecond}, MaxAttempts: 3,
			BackoffInitial: config.Duration{Duration: 2 * time.Millisecond}, BackoffMax: config.Duration{Duration: 50 * time.Millisecond}},
	}
	c.Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

// setup creates the database, the sink table (a CHECK constraint makes some
// rows poison) and the inbox.
func setup(t *testing.T, cfg *config.Config) (*pgxpool.Pool, string) {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	pgtest.Exec(t, pool, "CREATE SCHEMA app",
		"CREATE TABLE app.effects (seq bigserial, message_id text NOT NULL, n int CHECK (n >= 0))")
	store, err := inbox.ForConfig(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return pool, dsn
}

func message(native, body string) source.Message {
	return source.Message{NativeID: native, Body: []byte(body), Headers: map[string]string{"H": native},
		PublishedAt: time.Now().Add(-time.Duration(rand.IntN(72)) * time.Hour)}
}

// withDuplicates returns total messages over unique ids: the rest re-use
// earlier ids (new native ids, as a producer retry would), in random order.
func withDuplicates(total, unique int) []source.Message {
	msgs := make([]source.Message, 0, total)
	for i := range unique {
		msgs = append(msgs, message(fmt.Sprintf("n%05d", i), fmt.Sprintf(`{"id":"id-%d","n":%d}`, i, i)))
	}
	for i := unique; i < total; i++ {
		d := rand.IntN(unique)
		msgs = append(msgs, message(fmt.Sprintf("n%05d", i), fmt.Sprintf(`{"id":"id-%d","n":%d}`, d, d)))
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	return msgs
}

type running struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
	c      *Consumer
}

func start(t *testing.T, src source.Source, pool *pgxpool.Pool, cfg *config.Config, m *Metrics) *running {
	t.Helper()
	c, err := New(src, postgres.New(pool), cfg, m, testr.NewWithOptions(t, testr.Options{Verbosity: 0}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan struct{}), c: c}
	go func() {
		defer close(r.done)
		r.err = c.Run(ctx)
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *running) stop(t *testing.T) {
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if r.err != nil {
		t.Fatalf("Run returned %v, want nil on stop", r.err)
	}
}

// waitSettled waits until every message was acked. It redelivers nothing:
// a source that loses acks gives the batch back itself (refusingAcks), so a
// message still in flight at the timeout is one the consumer lost.
func waitSettled(t *testing.T, src *fakeSource, total int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !src.settled(total) {
		if time.Now().After(deadline) {
			src.mu.Lock()
			defer src.mu.Unlock()
			t.Fatalf("not settled after %s: pending %d, in flight %d, acked %d of %d",
				timeout, len(src.pending), len(src.inflight), len(src.acked), total)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// refusingAcks is the fake broker whose refused Ack gives the batch back at
// once, as a broker redelivers an unacknowledged batch (after its ack
// timeout, or when the channel that held it closes): the consumer never
// acknowledges a batch again after its Ack failed.
type refusingAcks struct{ *fakeSource }

func (r refusingAcks) Ack(ctx context.Context, msgs []source.Message) error {
	err := r.fakeSource.Ack(ctx, msgs)
	if errors.Is(err, errAckRefused) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, m := range msgs {
			if _, ok := r.inflight[m.NativeID]; ok {
				delete(r.inflight, m.NativeID)
				r.pending = append(r.pending, m)
				r.redelivered++
			}
		}
	}
	return err
}

// assertExactlyOnce checks that the sink holds exactly one effect per id.
func assertExactlyOnce(t *testing.T, pool *pgxpool.Pool, unique int) {
	t.Helper()
	var rows, distinct int
	err := pool.QueryRow(context.Background(), "SELECT count(*), count(DISTINCT message_id) FROM app.effects").Scan(&rows, &distinct)
	if err != nil {
		t.Fatal(err)
	}
	if rows != unique || distinct != unique {
		t.Fatalf("sink holds %d effects for %d distinct ids; want exactly %d", rows, distinct, unique)
	}
}

func newMetrics(t *testing.T) *Metrics {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDuplicatesGiveExactlyOneEffect(t *testing.T) {
	for _, layout := range []config.Layout{config.LayoutTable, config.LayoutPartitioned} {
		t.Run(string(layout), func(t *testing.T) {
			cfg := testConfig(t, layout)
			pool, _ := setup(t, cfg)
			const total, unique = 500, 400
			src := newFakeSource(withDuplicates(total, unique))
			src.ackErrs = 2 // two batches must be redelivered after a lost ack
			m := newMetrics(t)
			r := start(t, refusingAcks{src}, pool, cfg, m)
			waitSettled(t, src, total, time.Minute)
			r.stop(t)
			assertExactlyOnce(t, pool, unique)
			if !r.c.Ready() {
				t.Error("Ready() = false after a successful run")
			}
			if got := testutil.ToFloat64(m.AckErrors); got != 2 {
				t.Errorf("idc_ack_errors_total = %v, want 2", got)
			}
			msgs, dups := int(testutil.ToFloat64(m.Messages)), int(testutil.ToFloat64(m.DuplicatesSkipped))
			// idc_messages_total counts acknowledged messages: each once,
			// the refused batches when they came back. Those came back
			// as duplicates of their own commit.
			src.mu.Lock()
			redelivered := src.redelivered
			src.mu.Unlock()
			if redelivered == 0 {
				t.Fatal("no message was redelivered after a refused ack")
			}
			if msgs != total {
				t.Errorf("idc_messages_total = %d, want %d (every message acknowledged once)", msgs, total)
			}
			if want := total - unique + redelivered; dups != want {
				t.Errorf("idc_duplicates_skipped_total = %d, want %d (%d re-sent + %d redelivered)", dups, want, total-unique, redelivered)
			}
			if deadLettersTotal(t, m) != 0 {
				t.Error("no message should have been dead-lettered")
			}
		})
	}
}

// A crash after COMMIT and before the ack: the broker redelivers the batch
// and the inbox refuses it, so no effect happens twice. With one lane the
// crash freezes the whole loop (as the failpoint's SIGKILL ends the whole
// process); batches fetched ahead stay unacknowledged too.
func TestCrashBetweenCommitAndAck(t *testing.T) {
	cfg := testConfig(t, config.LayoutTable)
	cfg.Delivery.InFlight = 1
	pool, _ := setup(t, cfg)
	const total = 200
	src := newFakeSource(withDuplicates(total, total))
	var commits atomic.Int32
	crashed, dead := make(chan struct{}), make(chan struct{})
	AfterCommitHook = func() {
		if commits.Add(1) == 2 { // let one batch through, die on the second
			close(crashed)
			<-dead
			runtime.Goexit()
		}
	}
	defer func() { AfterCommitHook = nil }()
	c, err := New(src, postgres.New(pool), cfg, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	select {
	case <-crashed:
	case <-time.After(30 * time.Second):
		t.Fatal("the failpoint never fired")
	}
	var committed int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM app.effects").Scan(&committed); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	unacked, acked := len(src.inflight), len(src.acked)
	src.mu.Unlock()
	if committed != 2*cfg.Delivery.BatchSize || acked != cfg.Delivery.BatchSize || unacked < cfg.Delivery.BatchSize {
		t.Fatalf("at the crash: %d effects committed, %d acked, %d unacked; want %d, %d and at least the crashed batch's %d",
			committed, acked, unacked, 2*cfg.Delivery.BatchSize, cfg.Delivery.BatchSize, cfg.Delivery.BatchSize)
	}
	// The "process" is gone: stop its loop, then what it left unacked comes
	// back to a fresh one.
	AfterCommitHook = nil
	cancel()
	close(dead)
	src.redeliver()
	m := newMetrics(t)
	r := start(t, src, pool, cfg, m)
	waitSettled(t, src, total, time.Minute)
	r.stop(t)
	assertExactlyOnce(t, pool, total)
	if got := testutil.ToFloat64(m.DuplicatesSkipped); got != float64(cfg.Delivery.BatchSize) {
		t.Errorf("duplicates skipped after restart = %v, want the %d committed but unacknowledged", got, cfg.Delivery.BatchSize)
	}
}

func TestPoisonMessagesAreDeadLettered(t *testing.T) {
	cfg := testConfig(t, config.LayoutPartitioned)
	cfg.Delivery.BatchSize = 50
	pool, _ := setup(t, cfg)
	msgs := withDuplicates(30, 30)
	poison := map[string]string{
		"p-missing-id":  `{"n":1}`,
		"p-invalid":     `{"id":"bad-json","n":`,
		"p-check":       `{"id":"neg","n":-1}`,
		"p-not-int":     `{"id":"word","n":"abc"}`,
		"p-missing-col": `{"id":"no-n"}`,
	}
	for native, body := range poison {
		msgs = append(msgs, message(native, body))
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	src := newFakeSource(msgs)
	m := newMetrics(t)
	r := start(t, src, pool, cfg, m)
	waitSettled(t, src, len(msgs), time.Minute)
	// The same poison messages redelivered are not dead-lettered twice.
	for native, body := range poison {
		src.pending = append(src.pending, message(native, body))
	}
	src.mu.Lock()
	src.acked = map[string]int{}
	src.mu.Unlock()
	waitSettled(t, src, len(poison), time.Minute)
	r.stop(t)
	assertExactlyOnce(t, pool, 30)
	want := map[string]string{
		"p-missing-id":  "message id: $.id: value missing",
		"p-invalid":     "message id: $.id: invalid JSON payload",
		"p-check":       "database: ",
		"p-not-int":     "database: ",
		"p-missing-col": "column n: $.n: value missing",
	}
	rows, err := pool.Query(context.Background(), "SELECT native_id, reason, coalesce(message_id, ''), payload FROM app.inbox_orders_dead_letters")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var native, reason, id string
		var payload []byte
		if err := rows.Scan(&native, &reason, &id, &payload); err != nil {
			t.Fatal(err)
		}
		if string(payload) != poison[native] {
			t.Errorf("%s: payload %q not kept", native, payload)
		}
		got[native] = reason
	}
	if len(got) != len(want) {
		t.Fatalf("dead letters %v, want one each for %v", got, want)
	}
	for native, prefix := range want {
		if !strings.HasPrefix(got[native], prefix) {
			t.Errorf("%s: reason %q, want prefix %q", native, got[native], prefix)
		}
	}
	if !strings.Contains(got["p-check"], "check constraint") {
		t.Errorf("the CHECK violation's reason %q does not name it", got["p-check"])
	}
	for class, n := range map[string]float64{ReasonMissingID: 1, ReasonInvalidJSON: 1, ReasonDatabase: 2, ReasonEvaluation: 1} {
		// Each poison message is delivered at least twice; only the first
		// dead-lettering inserts a row, and only rows count.
		if got := testutil.ToFloat64(m.DeadLetters.WithLabelValues(class)); got != n {
			t.Errorf("idc_dead_letters_total{reason=%q} = %v, want %v", class, got, n)
		}
	}
	// A dead-lettered id is not left claimed: a corrected re-publish applies.
	var claimed int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM app.inbox_orders WHERE message_id IN ('neg','word','no-n')").Scan(&claimed); err != nil || claimed != 0 {
		t.Errorf("%d dead-lettered ids left in the inbox (%v)", claimed, err)
	}
}

// Killing the consumer's database connections mid-run loses nothing,
// doubles nothing and dead-letters nothing.
func TestTerminatedConnectionsLoseAndDoubleNothing(t *testing.T) {
	cfg := testConfig(t, config.LayoutTable)
	// One attempt: were a connection failure ever counted against a
	// message, it would be dead-lettered at once.
	cfg.Delivery.MaxAttempts = 1
	// Small transactions keep the load going for hundreds of commits, so
	// the killer lands during it however fast the loop is (with batches of
	// the default size the load could end before five backends died).
	cfg.Delivery.BatchSize = 10
	pool, dsn := setup(t, cfg)
	const total = 6000
	src := newFakeSource(withDuplicates(total, total))
	r := start(t, src, pool, cfg, newMetrics(t))
	killer, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer killer.Close(context.Background())
	var kills atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(20+rand.IntN(40)) * time.Millisecond):
			}
			var n int64
			err := killer.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&n)
			if err != nil {
				t.Errorf("while terminating backends: %v", err)
				return
			}
			kills.Add(n)
		}
	})
	waitSettled(t, src, total, 3*time.Minute)
	close(stop)
	wg.Wait()
	r.stop(t)
	if kills.Load() < 5 {
		t.Fatalf("only %d backends terminated: the test did not exercise anything", kills.Load())
	}
	// The consumer's pool may still hold connections killed at the end.
	check, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	assertExactlyOnce(t, check, total)
	var dead int
	if err := check.QueryRow(context.Background(), "SELECT count(*) FROM app.inbox_orders_dead_letters").Scan(&dead); err != nil || dead != 0 {
		t.Fatalf("%d messages dead-lettered because the database was down (%v); want 0", dead, err)
	}
	t.Logf("%d backends terminated during the run", kills.Load())
}

// The http effect: each id is called with its Idempotency-Key, a redelivered
// success is not called again, a 4xx is dead-lettered at once and a record
// that keeps failing with 5xx after MaxAttempts.
func TestHTTPEffectOutsideTheTransaction(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ ID string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		calls[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		switch body.ID {
		case "refused":
			w.WriteHeader(http.StatusUnprocessableEntity)
		case "broken":
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	cfg := testConfig(t, config.LayoutTable)
	cfg.Sink.Effect = config.Effect{HTTP: &config.HTTP{URL: srv.URL}}
	cfg.Default()
	pool, _ := setup(t, cfg)
	msgs := withDuplicates(20, 20)
	msgs = append(msgs, message("x1", `{"id":"refused"}`), message("x2", `{"id":"broken"}`))
	src := newFakeSource(msgs)
	r := start(t, src, pool, cfg, newMetrics(t))
	waitSettled(t, src, len(msgs), time.Minute)
	src.mu.Lock()
	src.pending = withDuplicates(20, 20)[:5] // redeliveries of ids already called
	src.acked = map[string]int{}
	src.mu.Unlock()
	waitSettled(t, src, 5, time.Minute)
	r.stop(t)
	mu.Lock()
	defer mu.Unlock()
	for i := range 20 {
		if n := calls[fmt.Sprintf("id-%d", i)]; n != 1 {
			t.Errorf("id-%d called %d times, want 1", i, n)
		}
	}
	if calls["refused"] != 1 || calls["broken"] != cfg.Delivery.MaxAttempts {
		t.Errorf("refused called %d times (want 1), broken %d (want %d)", calls["refused"], calls["broken"], cfg.Delivery.MaxAttempts)
	}
	var reasons []string
	rows, _ := pool.Query(context.Background(), "SELECT reason FROM app.inbox_orders_dead_letters ORDER BY native_id")
	reasons, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(reasons) != 2 || !strings.Contains(reasons[0], "status 422") || !strings.Contains(reasons[1], "status 500") {
		t.Fatalf("dead letters %q (%v), want the 422 and the 500", reasons, err)
	}
	var claimed int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM app.inbox_orders").Scan(&claimed); err != nil || claimed != 20 {
		t.Fatalf("inbox rows %d (%v), want 20", claimed, err)
	}
}

// A stop requested while a batch is in flight still commits and acks it,
// starts no batch fetched ahead (those stay unacknowledged for the broker to
// redeliver), and Run returns nil. Every acknowledged message was committed.
func TestGracefulStopFinishesTheBatchInFlight(t *testing.T) {
	cfg := testConfig(t, config.LayoutTable)
	cfg.Delivery.InFlight = 1
	pool, _ := setup(t, cfg)
	src := newFakeSource(withDuplicates(100, 100))
	c, err := New(src, postgres.New(pool), cfg, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	AfterCommitHook = cancel // the stop arrives between commit and ack
	defer func() { AfterCommitHook = nil }()
	if err := c.Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	src.mu.Lock()
	acked, inflight, pending := len(src.acked), len(src.inflight), len(src.pending)
	src.mu.Unlock()
	if acked != cfg.Delivery.BatchSize || acked+inflight+pending != 100 {
		t.Fatalf("after stop: %d acked, %d in flight, %d pending; want %d acked and the other %d unacknowledged",
			acked, inflight, pending, cfg.Delivery.BatchSize, 100-cfg.Delivery.BatchSize)
	}
	assertExactlyOnce(t, pool, cfg.Delivery.BatchSize)
}
