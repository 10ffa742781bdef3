package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

const dsnEnv = "IDC_TEST_RUNTIME_DSN"

// pruneFixture is a database with a migrated inbox and a config file.
type pruneFixture struct {
	pool   *pgxpool.Pool
	cfg    *config.Config
	path   string
	store  *inbox.Store
	stream string
}

func newPruneFixture(t *testing.T, layout config.Layout, ret config.Retention, maxAge time.Duration) *pruneFixture {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	t.Setenv(dsnEnv, dsn)
	f := &pruneFixture{pool: pool, stream: createStream(t, maxAge)}
	f.cfg = &config.Config{
		Name:    "test/prune",
		Source:  config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: f.stream, Consumer: "projector"}},
		Message: config.Message{ID: config.Extractor{Header: "Nats-Msg-Id"}},
		Sink: config.Sink{DSNEnv: dsnEnv, Schema: "app", InboxTable: "inbox_prune", Layout: layout,
			Effect: config.Effect{Append: &config.Append{Table: "events", Columns: map[string]string{"id": "@messageId"}}}},
		Retention: ret,
	}
	f.path = writeConfig(t, f.cfg)
	cfg, err := config.Load(f.path)
	if err != nil {
		t.Fatal(err)
	}
	f.cfg = cfg
	if f.store, err = inbox.ForConfig(pool, cfg); err != nil {
		t.Fatal(err)
	}
	return f
}

func writeConfig(t *testing.T, cfg *config.Config) string {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// createStream makes a JetStream stream private to the test; maxAge 0 is
// unbounded (no age limit).
func createStream(t *testing.T, maxAge time.Duration) string {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatalf("NATS JetStream at %s is required (make nats; with IDC_TEST_NATS=system, make services): %v", natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("IDC_PRUNE_%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}, MaxAge: maxAge}); err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	return name
}

// run executes the command in-process and returns its exit code and the
// JSON log lines it wrote.
func (f *pruneFixture) run(t *testing.T, args ...string) (int, []map[string]any) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := dispatch(append(args, "--config", f.path), &out, &errOut)
	var lines []map[string]any
	sc := bufio.NewScanner(&errOut)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		lines = append(lines, m)
	}
	return code, lines
}

// seed inserts n inbox rows processed age ago.
func (f *pruneFixture) seed(t *testing.T, prefix string, n int, age time.Duration) {
	t.Helper()
	_, err := f.pool.Exec(context.Background(), `INSERT INTO `+f.store.QualifiedInbox()+` (message_id, processed_at)
		SELECT $1 || g, now() - $2::bigint * interval '1 second' FROM generate_series(1, $3) g`,
		prefix, int64(age/time.Second), n)
	if err != nil {
		t.Fatal(err)
	}
}

func (f *pruneFixture) count(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+f.store.QualifiedInbox()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func findLine(t *testing.T, lines []map[string]any, msg string) map[string]any {
	t.Helper()
	for _, l := range lines {
		if l["msg"] == msg {
			return l
		}
	}
	t.Fatalf("no log line %q in %v", msg, lines)
	return nil
}

func explicit(window time.Duration) config.Retention {
	return config.Retention{Mode: "Explicit", Window: config.Duration{Duration: window}}
}

func TestMigrateThenPruneTable(t *testing.T) {
	f := newPruneFixture(t, config.LayoutTable, explicit(time.Hour), time.Hour)
	if code, lines := f.run(t, "migrate"); code != exitOK {
		t.Fatalf("migrate exit %d: %v", code, lines)
	}
	if code, _ := f.run(t, "migrate"); code != exitOK {
		t.Fatalf("second migrate exit %d", code)
	}
	f.seed(t, "old-", 120, 2*time.Hour)
	f.seed(t, "new-", 30, time.Minute)

	// The controller's larger window wins: nothing is old enough.
	code, lines := f.run(t, "prune", "--window", "3h")
	if code != exitOK {
		t.Fatalf("prune exit %d: %v", code, lines)
	}
	l := findLine(t, lines, "Prune finished")
	if l["windowSource"] != windowFromController || l["window"] != "3h0m0s" || l["rowsDeleted"] != float64(0) {
		t.Errorf("log line %v: want the controller's 3h window and nothing deleted", l)
	}
	if n := f.count(t); n != 150 {
		t.Fatalf("%d rows left, want 150", n)
	}

	// Outbox rows: sent 2h ago (past the window), sent just now, and unsent
	// for 2h (never pruned). The config does not emit (any more): the
	// outbox an earlier config had is still pruned.
	emitted, err := inbox.New(f.pool, f.cfg.Sink, inbox.WithOutbox(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := emitted.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	outbox := pgx.Identifier{f.cfg.Sink.Schema, inbox.NamesFor(f.cfg.Sink).Outbox}.Sanitize()
	if _, err := f.pool.Exec(context.Background(), `INSERT INTO `+outbox+` (event_id, source_id, shard, payload, created_at, sent_at) VALUES
		('old-sent', 'a', 0, '{}', now() - interval '3 hours', now() - interval '2 hours'),
		('new-sent', 'b', 0, '{}', now(), now()),
		('old-unsent', 'c', 0, '{}', now() - interval '2 hours', NULL)`); err != nil {
		t.Fatal(err)
	}
	code, lines = f.run(t, "prune", "--window", "30m")
	if code != exitOK {
		t.Fatalf("prune exit %d: %v", code, lines)
	}
	if l := findLine(t, lines, "Outbox pruned"); l["outboxRowsDeleted"] != float64(1) {
		t.Errorf("log line %v: want the one sent outbox row past the window deleted", l)
	}
	l = findLine(t, lines, "Prune finished")
	if l["windowSource"] != windowFromDerived || l["window"] != "1h0m0s" || l["rowsDeleted"] != float64(120) || l["cutoff"] == nil {
		t.Errorf("log line %v: want the derived 1h window and 120 rows deleted", l)
	}
	if n := f.count(t); n != 30 {
		t.Fatalf("%d rows left, want 30", n)
	}
	last, err := f.store.LastPruneRun(context.Background())
	if err != nil || last == nil || last.RowsDeleted != 120 || last.Window != time.Hour {
		t.Fatalf("last prune run %+v (%v): want 120 rows with a 1h window recorded", last, err)
	}
}

func TestPruneDerivesFromTheBroker(t *testing.T) {
	// Limits retention with MaxAge 2h: replay reaches 2h back, so W = 2h.
	f := newPruneFixture(t, config.LayoutTable, config.Retention{Mode: "Derived"}, 2*time.Hour)
	if code, _ := f.run(t, "migrate"); code != exitOK {
		t.Fatal("migrate failed")
	}
	f.seed(t, "old-", 10, 3*time.Hour)
	f.seed(t, "new-", 10, time.Hour)
	code, lines := f.run(t, "prune")
	l := findLine(t, lines, "Prune finished")
	if code != exitOK || l["window"] != "2h0m0s" || l["windowSource"] != windowFromDerived || f.count(t) != 10 {
		t.Fatalf("exit %d, line %v, %d rows left: want the derived 2h window and 10 rows left", code, l, f.count(t))
	}
	if !strings.Contains(fmt.Sprint(l["derivedFrom"]), f.stream) {
		t.Errorf("derivedFrom %q does not name the stream", l["derivedFrom"])
	}
}

func TestPruneRefusesUnboundedReplay(t *testing.T) {
	// MaxAge 0 under limits retention: replay is unbounded and no
	// maxReplayAge is declared. Even the controller's window must not be used.
	f := newPruneFixture(t, config.LayoutTable, config.Retention{Mode: "Derived"}, 0)
	if code, _ := f.run(t, "migrate"); code != exitOK {
		t.Fatal("migrate failed")
	}
	f.seed(t, "ancient-", 10, 1000*time.Hour)
	code, lines := f.run(t, "prune", "--window", "1h")
	if code != exitRefused {
		t.Fatalf("exit %d, want %d: %v", code, exitRefused, lines)
	}
	l := findLine(t, lines, "Command failed")
	if !strings.Contains(fmt.Sprint(l["err"]), "unbounded replay") {
		t.Errorf("error %q does not say why", l["err"])
	}
	if n := f.count(t); n != 10 {
		t.Fatalf("%d rows left, want all 10", n)
	}
}

func TestPruneWhenTheBrokerIsUnreachable(t *testing.T) {
	f := newPruneFixture(t, config.LayoutTable, config.Retention{Mode: "Derived"}, time.Hour)
	f.cfg.Source.NATSJetStream.URL = "nats://127.0.0.1:1"
	f.path = writeConfig(t, f.cfg)
	if code, _ := f.run(t, "migrate"); code != exitOK {
		t.Fatal("migrate failed")
	}
	f.seed(t, "old-", 10, 3*time.Hour)
	if code, lines := f.run(t, "prune"); code != exitRefused || f.count(t) != 10 {
		t.Fatalf("without --window: exit %d, %d rows left, want %d and all 10 left: %v", code, f.count(t), exitRefused, lines)
	}
	code, lines := f.run(t, "prune", "--window", "2h")
	l := findLine(t, lines, "Prune finished")
	if code != exitOK || l["windowSource"] != windowFromController || f.count(t) != 0 {
		t.Fatalf("with --window: exit %d, line %v, %d rows left", code, l, f.count(t))
	}
}

func TestPrunePartitioned(t *testing.T) {
	f := newPruneFixture(t, config.LayoutPartitioned, explicit(48*time.Hour), time.Hour)
	if code, _ := f.run(t, "migrate"); code != exitOK {
		t.Fatal("migrate failed")
	}
	ctx := context.Background()
	old := time.Now().AddDate(0, 0, -10)
	if err := f.store.EnsurePartitions(ctx, old, 1); err != nil {
		t.Fatal(err)
	}
	// Processed on their publish day, ten days ago: the whole partition expired.
	if _, err := f.pool.Exec(ctx, `INSERT INTO `+f.store.QualifiedInbox()+` (message_id, published_on, processed_at) VALUES ('a', $1, $2), ('b', $1, $2)`,
		inbox.Day(old), old); err != nil {
		t.Fatal(err)
	}
	code, lines := f.run(t, "prune")
	l := findLine(t, lines, "Prune finished")
	if code != exitOK || l["partitionsDropped"] != float64(1) || f.count(t) != 0 {
		t.Fatalf("exit %d, line %v, %d rows left: want one partition dropped", code, l, f.count(t))
	}
	for i := range partitionDaysAhead {
		name := f.store.PartitionName(inbox.Day(time.Now().AddDate(0, 0, i)))
		var exists bool
		if err := f.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, "app."+name).Scan(&exists); err != nil || !exists {
			t.Errorf("partition %s ahead does not exist (%v)", name, err)
		}
	}
}

func TestPruneBeforeProvisioningDeletesNothing(t *testing.T) {
	f := newPruneFixture(t, config.LayoutTable, explicit(time.Hour), time.Hour)
	code, lines := f.run(t, "prune")
	if code != exitOK {
		t.Fatalf("exit %d: %v", code, lines)
	}
	findLine(t, lines, "Inbox not provisioned yet; nothing to prune")
}

func TestMissingDSNEnvIsNamed(t *testing.T) {
	f := newPruneFixture(t, config.LayoutTable, explicit(time.Hour), time.Hour)
	t.Setenv(dsnEnv, "")
	code, lines := f.run(t, "migrate")
	if code != exitUsage {
		t.Fatalf("exit %d, want %d", code, exitUsage)
	}
	if l := findLine(t, lines, "Command failed"); !strings.Contains(fmt.Sprint(l["err"]), dsnEnv) {
		t.Errorf("error %q does not name %s", l["err"], dsnEnv)
	}
}

// TestPruneKeepsTheStoredWindowOfAReCreatedResource: the window's shrink
// state lives in <inbox>_window, so a resource re-created with a smaller
// window (and no status, so no --window) still prunes with the old window
// until it has elapsed; once the tables are dropped (deletionPolicy: Delete)
// the smaller window applies at once.
func TestPruneKeepsTheStoredWindowOfAReCreatedResource(t *testing.T) {
	f := newPruneFixture(t, config.LayoutTable, explicit(24*time.Hour), time.Hour)
	if code, _ := f.run(t, "migrate"); code != exitOK {
		t.Fatal("migrate failed")
	}
	f.seed(t, "old-", 20, 2*time.Hour)
	if code, lines := f.run(t, "prune"); code != exitOK || findLine(t, lines, "Prune finished")["window"] != "24h0m0s" {
		t.Fatalf("first prune exit %d: %v", code, lines)
	}
	// Re-created with window 1h: the stored 24h stays in force.
	f.cfg.Retention = explicit(time.Hour)
	f.path = writeConfig(t, f.cfg)
	code, lines := f.run(t, "prune")
	l := findLine(t, lines, "Prune finished")
	if code != exitOK || l["window"] != "24h0m0s" || l["windowSource"] != windowFromStored || l["rowsDeleted"] != float64(0) {
		t.Fatalf("exit %d, line %v: want the stored 24h window and nothing deleted", code, l)
	}
	st, err := f.store.ReadWindow(context.Background())
	if err != nil || st == nil || st.Window != 24*time.Hour || st.PendingWindow != time.Hour || st.PendingSince == nil {
		t.Fatalf("stored window %+v (%v): want 24h in force and 1h pending", st, err)
	}
	// The old window has elapsed since the shrink was first seen.
	if _, err := f.pool.Exec(context.Background(), `UPDATE `+pgx.Identifier{f.cfg.Sink.Schema, inbox.NamesFor(f.cfg.Sink).Window}.Sanitize()+
		` SET pending_since = now() - interval '25 hours'`); err != nil {
		t.Fatal(err)
	}
	code, lines = f.run(t, "prune")
	if l := findLine(t, lines, "Prune finished"); code != exitOK || l["window"] != "1h0m0s" || l["rowsDeleted"] != float64(20) {
		t.Fatalf("exit %d, line %v: want the 1h window adopted and the 20 old rows deleted", code, l)
	}
	// Grown back to 24h (a growth applies at once), then deleted with
	// deletionPolicy: Delete, which drops the state with the tables, and
	// re-created with 1h: it starts fresh.
	f.cfg.Retention = explicit(24 * time.Hour)
	f.path = writeConfig(t, f.cfg)
	if code, lines := f.run(t, "prune"); code != exitOK || findLine(t, lines, "Prune finished")["window"] != "24h0m0s" {
		t.Fatalf("prune exit %d: %v", code, lines)
	}
	if err := f.store.Drop(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.cfg.Retention = explicit(time.Hour)
	f.path = writeConfig(t, f.cfg)
	if code, _ := f.run(t, "migrate"); code != exitOK {
		t.Fatal("migrate failed")
	}
	code, lines = f.run(t, "prune")
	if l := findLine(t, lines, "Prune finished"); code != exitOK || l["window"] != "1h0m0s" || l["storedWindow"] != "1h0m0s" {
		t.Fatalf("exit %d, line %v: a re-created inbox starts fresh with 1h", code, l)
	}
}
