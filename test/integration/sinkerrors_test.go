package integration

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/consumer"
)

// sinkErrorMessages is how many messages each sink-error case publishes.
const sinkErrorMessages = 1000

// sinkErrorCase is a sink broken one way, and how to fix it.
type sinkErrorCase struct {
	name   string
	reason string // the idc_sink_misconfigured label and the /readyz reason
	// prepare breaks the sink and returns the config to run (role: the
	// DSN's user, "" for postgres).
	prepare func(t *testing.T, db *database, cfg *config.Config) (role string)
	// fix repairs the sink in the database; restart is set when the fix is
	// a new config (a statement can only be fixed in the spec, which the
	// controller rolls out as new pods).
	fix     func(t *testing.T, db *database, cfg *config.Config)
	restart bool
}

// TestSinkErrorsHoldTheRealBinary runs the real idc-runtime against
// JetStream and PostgreSQL with a misconfigured sink. While it is broken: no
// dead letter, no acknowledgement, /readyz 503 with the reason and
// idc_sink_misconfigured{reason} = 1. After the fix: all messages applied
// exactly once, by the same process.
func TestSinkErrorsHoldTheRealBinary(t *testing.T) {
	bin := buildBinary(t)
	upsertByID := func(cfg *config.Config) {
		cfg.Sink.Effect = config.Effect{Upsert: &config.Upsert{Table: "effects", Key: []string{"message_id"},
			Columns: map[string]string{"message_id": "@messageId", "n": "$.n"}}}
	}
	cases := []sinkErrorCase{
		{name: "missing table", reason: consumer.SinkUndefinedTable,
			prepare: func(*testing.T, *database, *config.Config) string { return "" },
			fix:     func(t *testing.T, db *database, _ *config.Config) { db.exec(t, effectsTable) }},
		{name: "missing column", reason: consumer.SinkUndefinedColumn,
			prepare: func(t *testing.T, db *database, _ *config.Config) string {
				db.exec(t, "CREATE TABLE app.effects (seq bigserial PRIMARY KEY, message_id text NOT NULL)")
				return ""
			},
			fix: func(t *testing.T, db *database, _ *config.Config) {
				db.exec(t, "ALTER TABLE app.effects ADD COLUMN n int NOT NULL")
			}},
		{name: "no unique key for ON CONFLICT", reason: consumer.SinkNoUniqueConstraint,
			prepare: func(t *testing.T, db *database, cfg *config.Config) string {
				db.exec(t, "CREATE TABLE app.effects (message_id text NOT NULL, n int NOT NULL)")
				upsertByID(cfg)
				return ""
			},
			fix: func(t *testing.T, db *database, _ *config.Config) {
				db.exec(t, "CREATE UNIQUE INDEX ON app.effects (message_id)")
			}},
		{name: "missing privilege", reason: consumer.SinkInsufficientPrivilege,
			prepare: func(t *testing.T, db *database, _ *config.Config) string {
				role := "idc_it_" + db.name[len(db.name)-8:]
				db.exec(t, "CREATE ROLE "+role+" LOGIN", "GRANT CREATE ON DATABASE "+pgx.Identifier{db.name}.Sanitize()+" TO "+role)
				// Cleanups run last-registered first: the role's objects go
				// before the role (the database itself is dropped after).
				t.Cleanup(func() { dropRole(t, role) })
				t.Cleanup(func() { _, _ = db.pool.Exec(context.Background(), "DROP OWNED BY "+role+" CASCADE") })
				// The role provisions its own inbox (as the pod does at
				// startup) but may only read the effect table.
				db.exec(t, "ALTER SCHEMA app OWNER TO "+role,
					"CREATE TABLE app.effects (message_id text NOT NULL, n int NOT NULL)",
					"GRANT SELECT ON app.effects TO "+role)
				return role
			},
			fix: func(t *testing.T, db *database, _ *config.Config) {
				role := "idc_it_" + db.name[len(db.name)-8:]
				db.exec(t, "GRANT INSERT ON app.effects TO "+role)
			}},
		{name: "two-command statement", reason: consumer.SinkInvalidStatement, restart: true,
			prepare: func(t *testing.T, db *database, cfg *config.Config) string {
				db.exec(t, effectsTable)
				cfg.Sink.Effect = config.Effect{SQL: &config.SQL{
					Statement: "INSERT INTO app.effects (message_id, n) VALUES (:id, :n); SELECT 1",
					Params:    map[string]string{"id": "@messageId", "n": "$.n"},
				}}
				return ""
			},
			fix: func(_ *testing.T, _ *database, cfg *config.Config) {
				cfg.Sink.Effect.SQL.Statement = "INSERT INTO app.effects (message_id, n) VALUES (:id, :n)"
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { sinkErrorHolds(t, bin, tc) })
	}
	t.Run("data error dead-letters only its message", func(t *testing.T) { dataErrorDeadLettersOne(t, bin) })
}

func sinkErrorHolds(t *testing.T, bin string, tc sinkErrorCase) {
	// AckWait well above the hold: the held batch is not redelivered
	// meanwhile, so "nothing acknowledged" is read off the ack floor.
	b := newJetStream(t, 10*time.Second)
	db := newDatabase(t)
	db.exec(t, "CREATE SCHEMA app")
	cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
	// One attempt: a sink error ever counted against a message would
	// dead-letter it at once.
	cfg.Delivery.MaxAttempts = 1
	role := tc.prepare(t, db, cfg)
	if role != "" {
		cfg.Sink.DSNEnv = roleDSNEnv(t, db, role)
	}
	var msgs []outgoing
	for _, e := range plainEvents(sinkErrorMessages) {
		msgs = append(msgs, e.outgoing())
	}
	b.publish(t, msgs)

	p := startBinary(t, bin, cfg)
	gauge := fmt.Sprintf(`idc_sink_misconfigured{reason=%q,sink_kind="postgres"} 1`, tc.reason)
	waitFor(t, 60*time.Second, "the hold (gauge at 1, three backoff steps logged)", func() error {
		_, metrics, err := p.get("/metrics")
		if err != nil {
			return err
		}
		if !strings.Contains(metrics, gauge) {
			return fmt.Errorf("/metrics lacks %s", gauge)
		}
		if n := holdSteps(p.logs.String()); n < 3 {
			return fmt.Errorf("%d hold steps logged", n)
		}
		return nil
	})
	code, body, err := p.get("/readyz")
	if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, tc.reason) {
		t.Errorf("/readyz while held = %d %q (%v); want 503 naming %s", code, body, err, tc.reason)
	}
	info, err := b.info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 0 {
		t.Errorf("while held: ack floor at stream sequence %d, want nothing acknowledged", info.AckFloor.Stream)
	}
	if dl := db.queryInt(t, "SELECT count(*) FROM app.inbox_orders_dead_letters"); dl != 0 {
		t.Errorf("while held: %d dead letters, want 0", dl)
	}
	if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_orders"); n != 0 {
		t.Errorf("while held: %d inbox rows, want 0", n)
	}
	logs := p.logs.String()
	steps := holdSteps(logs)
	// One line per backoff step, not per message: each step number once.
	for step := 1; step <= 3; step++ {
		if n := strings.Count(logs, fmt.Sprintf(`"step":%d,`, step)); n != 1 {
			t.Errorf("hold step %d logged %d times, want once", step, n)
		}
	}
	t.Logf("%s: held with %d log lines for %d messages; /readyz: %s", tc.name, steps, sinkErrorMessages, strings.TrimSpace(body))

	tc.fix(t, db, cfg)
	if tc.restart {
		expectCleanExit(t, p, p.terminate(t))
		p = startBinary(t, bin, cfg)
	}
	waitFor(t, 90*time.Second, "every message applied", func() error {
		if n := db.queryInt(t, "SELECT count(*) FROM app.effects"); n < sinkErrorMessages {
			return fmt.Errorf("%d of %d effects", n, sinkErrorMessages)
		}
		return nil
	})
	checkExactlyOnce(t, db, b, sinkErrorMessages)
	p.waitStatus(t, "/readyz", http.StatusOK, 30*time.Second)
	metrics := p.waitStatus(t, "/metrics", http.StatusOK, 5*time.Second)
	if !strings.Contains(metrics, fmt.Sprintf(`idc_sink_misconfigured{reason=%q,sink_kind="postgres"} 0`, tc.reason)) {
		t.Errorf("after the fix the gauge is not back at 0")
	}
	if !tc.restart && !strings.Contains(p.logs.String(), `"msg":"Sink fixed; consuming again"`) {
		t.Error("the recovery was not logged")
	}
	select {
	case <-p.exited:
		t.Fatalf("the process exited: %s", p.state)
	default:
	}
	expectCleanExit(t, p, p.terminate(t))
}

var holdLine = regexp.MustCompile(`"msg":"Sink misconfigured; holding[^"]*"`)

func holdSteps(logs string) int { return len(holdLine.FindAllString(logs, -1)) }

// roleDSNEnv sets an environment variable holding a DSN for role on db.
func roleDSNEnv(t *testing.T, db *database, role string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := "IDC_INTEGRATION_ROLE_DSN_" + strings.ToUpper(role)
	t.Setenv(name, fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", role, cfg.Host, cfg.Port, db.name))
	return name
}

func dropRole(t *testing.T, role string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	if err != nil {
		t.Errorf("dropping role %s: %v", role, err)
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{role}.Sanitize())
}

// A data error (a not-null violation) on one message of a batch of 500
// dead-letters exactly that message; the other 499 are applied.
func dataErrorDeadLettersOne(t *testing.T, bin string) {
	const total, poison = 500, 250
	b := newJetStream(t, 30*time.Second)
	db := newDatabase(t)
	db.exec(t, "CREATE SCHEMA app", effectsTable)
	cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
	cfg.Delivery.BatchSize = total
	cfg.Delivery.MaxWait = config.Duration{Duration: time.Second}
	var msgs []outgoing
	for _, e := range plainEvents(total) {
		o := e.outgoing()
		if e.N == poison {
			o.body = fmt.Appendf(nil, `{"id":%q,"n":null}`, e.ID)
		}
		msgs = append(msgs, o)
	}
	b.publish(t, msgs)
	p := startBinary(t, bin, cfg)
	waitFor(t, 60*time.Second, "every message acknowledged", func() error { return b.drained(context.Background()) })
	if n := db.queryInt(t, "SELECT count(*) FROM app.effects"); n != total-1 {
		t.Errorf("%d effects, want %d", n, total-1)
	}
	if n := db.queryInt(t, "SELECT count(DISTINCT message_id) FROM app.effects"); n != total-1 {
		t.Errorf("%d distinct effects, want %d", n, total-1)
	}
	var id, reason string
	if err := db.pool.QueryRow(context.Background(), "SELECT message_id, reason FROM app.inbox_orders_dead_letters").Scan(&id, &reason); err != nil {
		t.Fatalf("reading the one dead letter: %v (rows: %d)", err, db.queryInt(t, "SELECT count(*) FROM app.inbox_orders_dead_letters"))
	}
	if want := fmt.Sprintf("evt-%06d", poison); id != want || !strings.Contains(reason, "23502") {
		t.Errorf("dead letter %s (%s), want %s for a not-null violation (SQLSTATE 23502)", id, reason, want)
	}
	if n := db.queryInt(t, "SELECT count(*) FROM app.effects WHERE message_id = $1", id); n != 0 {
		t.Errorf("the poison message was also applied")
	}
	if holdSteps(p.logs.String()) != 0 {
		t.Error("a data error held the consumer like a sink error")
	}
	expectCleanExit(t, p, p.terminate(t))
}
