package redrive

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
)

func upsertConfig(layout config.Layout) *config.Config {
	cfg := &config.Config{
		Name:   "test/orders",
		Source: config.Source{NATSJetStream: &config.JetStream{URL: "nats://127.0.0.1:4222", Stream: "S", Consumer: "c"}},
		Message: config.Message{ID: config.Extractor{JSONPath: "$.id"},
			Entity: &config.Entity{Key: config.Extractor{JSONPath: "$.orderId"}, Sequence: config.Extractor{JSONPath: "$.version"}}},
		Sink: config.Sink{DSNEnv: "UNUSED", Schema: "app", InboxTable: "inbox_orders", Layout: layout,
			Effect: config.Effect{Upsert: &config.Upsert{Table: "orders", Key: []string{"order_id"}, SequenceColumn: "version",
				Columns: map[string]string{"order_id": "$.orderId", "status": "$.status", "version": "$.version"}}}},
		Delivery: config.Delivery{MaxAttempts: 2, BackoffInitial: config.Duration{Duration: 5 * time.Millisecond},
			BackoffMax: config.Duration{Duration: 20 * time.Millisecond}},
	}
	cfg.Default()
	return cfg
}

type fixture struct {
	pool  *pgxpool.Pool
	store sink.Inbox
	r     *Redriver
}

func newFixture(t *testing.T, layout config.Layout) *fixture {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	cfg := upsertConfig(layout)
	pgtest.Exec(t, pool, "CREATE SCHEMA app",
		`CREATE TABLE app.orders (order_id text PRIMARY KEY, status text NOT NULL CHECK (status <> 'bad'), version int NOT NULL)`,
		`INSERT INTO app.orders VALUES ('o1', 'shipped', 5)`)
	r, err := New(postgres.New(pool), cfg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Store().Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &fixture{pool: pool, store: r.Store(), r: r}
}

// deadLetter writes a dead-letter row as the loop would (attempts 1).
func (f *fixture) deadLetter(t *testing.T, native, id string, payload map[string]any) {
	t.Helper()
	body, _ := json.Marshal(payload)
	err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		_, err := f.store.DeadLetter(context.Background(), tx, []inbox.DeadLetter{{
			MessageID: id, NativeID: native, Reason: "database: ERROR: the bug", Payload: body,
			Headers: map[string]string{"h": "v"}, Attempts: 1, PublishedAt: time.Now(),
		}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// seed: one row of each outcome.
func (f *fixture) seed(t *testing.T) {
	t.Helper()
	f.deadLetter(t, "n1", "e-stale", map[string]any{"id": "e-stale", "orderId": "o1", "status": "created", "version": 3})
	f.deadLetter(t, "n2", "e-apply", map[string]any{"id": "e-apply", "orderId": "o2", "status": "created", "version": 1})
	f.deadLetter(t, "n3", "e-dup", map[string]any{"id": "e-dup", "orderId": "o3", "status": "created", "version": 1})
	f.deadLetter(t, "n4", "", map[string]any{"orderId": "o4", "status": "created", "version": 1})
	f.deadLetter(t, "n5", "e-bad", map[string]any{"id": "e-bad", "orderId": "o5", "status": "bad", "version": 1})
	// e-dup was since delivered again and applied by the live loop.
	if err := f.store.EnsurePartitionsFor(context.Background(), []time.Time{time.Now()}); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(context.Background(), f.pool, func(tx pgx.Tx) error {
		_, err := f.store.Claim(context.Background(), tx, []inbox.Claim{{MessageID: "e-dup", PublishedAt: time.Now()}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestRedriveOutcomes(t *testing.T) {
	for _, layout := range []config.Layout{config.LayoutTable, config.LayoutPartitioned} {
		t.Run(string(layout), func(t *testing.T) {
			f := newFixture(t, layout)
			f.seed(t)
			ctx := context.Background()
			want := Result{Run: "dry", DryRun: true, Selected: 5, Applied: 1, Duplicates: 1, Stale: 1, StillFailing: 1, Unusable: 1}

			got, err := f.r.Run(ctx, Options{Run: "dry", DryRun: true})
			if err != nil || got != want {
				t.Fatalf("dry run = %+v, %v; want %+v", got, err, want)
			}
			if n := f.count(t, "SELECT count(*) FROM app.inbox_orders_dead_letters"); n != 5 {
				t.Fatalf("the dry run changed the dead letters: %d rows, want 5", n)
			}
			if n := f.count(t, "SELECT count(*) FROM app.inbox_orders_redrives") + f.count(t, "SELECT count(*) FROM app.orders WHERE order_id <> 'o1'"); n != 0 {
				t.Fatalf("the dry run left %d rows behind", n)
			}

			want.Run, want.DryRun = "r1", false
			got, err = f.r.Run(ctx, Options{Run: "r1"})
			if err != nil || got != want {
				t.Fatalf("redrive = %+v, %v; want %+v", got, err, want)
			}
			if v := f.count(t, "SELECT version FROM app.orders WHERE order_id = 'o1'"); v != 5 {
				t.Errorf("the stale update went through: o1 at version %d, want 5", v)
			}
			if n := f.count(t, "SELECT count(*) FROM app.orders"); n != 2 {
				t.Errorf("%d orders, want o1 and o2 only (o3 was applied by the live loop, o5 fails)", n)
			}
			var attempts int
			var reason, class string
			if err := f.pool.QueryRow(ctx, `SELECT attempts, reason, reason_class FROM app.inbox_orders_dead_letters
				WHERE message_id = 'e-bad'`).Scan(&attempts, &reason, &class); err != nil {
				t.Fatal(err)
			}
			if attempts != 2 || !strings.Contains(reason, "orders_status_check") || class != "database" {
				t.Errorf("the failing row: attempts %d, reason %q, class %q; want 2, the new CHECK violation, database", attempts, reason, class)
			}
			if n := f.count(t, "SELECT count(*) FROM app.inbox_orders_dead_letters WHERE message_id IS NULL"); n != 1 {
				t.Errorf("the row without an id: %d left, want 1", n)
			}
			if n := f.count(t, "SELECT count(*) FROM app.inbox_orders WHERE message_id = 'e-bad'"); n != 0 {
				t.Error("the failing message was left claimed in the inbox")
			}
			sum, err := f.store.RedriveSummary(ctx, "r1")
			if err != nil || sum.Total() != 5 || sum.Outcomes["stale"] != 1 || sum.Last.IsZero() {
				t.Errorf("summary = %+v, %v", sum, err)
			}

			// Twice is safe: only the failing and the unusable rows are left.
			got, err = f.r.Run(ctx, Options{Run: "r2", Filter: inbox.DeadLetterFilter{Classes: []string{"database"}}})
			if err != nil || got.Selected != 2 || got.StillFailing != 1 || got.Unusable != 1 {
				t.Errorf("second redrive = %+v, %v; want the 2 rows left, still failing and unusable", got, err)
			}
		})
	}
}

func TestRedriveFilters(t *testing.T) {
	f := newFixture(t, config.LayoutTable)
	f.seed(t)
	ctx := context.Background()
	cases := []struct {
		name   string
		filter inbox.DeadLetterFilter
		want   int
	}{
		{"everything", inbox.DeadLetterFilter{}, 5},
		{"by id", inbox.DeadLetterFilter{MessageIDs: []string{"e-apply", "e-bad", "nope"}}, 2},
		{"by class", inbox.DeadLetterFilter{Classes: []string{"database"}}, 5},
		{"by another class", inbox.DeadLetterFilter{Classes: []string{"http", "missing_id"}}, 0},
		{"limit", inbox.DeadLetterFilter{Limit: 3}, 3},
		{"since the future", inbox.DeadLetterFilter{Since: time.Now().Add(time.Hour)}, 0},
		{"until the future", inbox.DeadLetterFilter{Until: time.Now().Add(time.Hour)}, 5},
	}
	for _, tc := range cases {
		ids, err := f.store.SelectDeadLetters(ctx, tc.filter)
		if err != nil || len(ids) != tc.want {
			t.Errorf("%s: %d rows, %v; want %d", tc.name, len(ids), err, tc.want)
		}
	}
}

func TestRedriveStopsOnAMisconfiguredSink(t *testing.T) {
	f := newFixture(t, config.LayoutTable)
	f.seed(t)
	pgtest.Exec(t, f.pool, "DROP TABLE app.orders")
	_, err := f.r.Run(context.Background(), Options{Run: "broken"})
	if !errors.Is(err, ErrNotTheMessage) || !strings.Contains(err.Error(), "undefined_table") {
		t.Fatalf("redrive on a dropped effect table: %v; want ErrNotTheMessage naming undefined_table", err)
	}
	if n := f.count(t, "SELECT count(*) FROM app.inbox_orders_dead_letters WHERE attempts = 1"); n != 5 {
		t.Errorf("%d of 5 dead letters untouched, want all: the sink's fault is never the message's", n)
	}
}
