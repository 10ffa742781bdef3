package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
)

// database is a PostgreSQL database private to one test, dropped (with its
// connections forced out) when the test ends.
type database struct {
	name string
	dsn  string
	pool *pgxpool.Pool // for the test's own checks
}

func newDatabase(t *testing.T) *database {
	t.Helper()
	name, dsn := pgtest.Create(t, "idc_integration_test")
	db := &database{name: name, dsn: dsn}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db.pool = pool
	return db
}

func (db *database) newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (db *database) exec(t *testing.T, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := db.pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("running %q: %v", s, err)
		}
	}
}

func (db *database) queryInt(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("running %q: %v", sql, err)
	}
	return n
}

// terminateBackends kills every other connection to the database, as an
// operator's pg_terminate_backend or a failover would. It returns how many
// backends it terminated.
func (db *database) terminateBackends(ctx context.Context, admin *pgx.Conn) (int, error) {
	var n int
	err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db.name).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("while terminating backends: %w", err)
	}
	return n, nil
}

// The sinkDB of PostgreSQL: the tables live in schema app.
var _ sinkDB = (*database)(nil)

func (db *database) dialect() string { return "postgres" }

func (db *database) setDSNEnv(t *testing.T) string {
	t.Helper()
	name := "IDC_INTEGRATION_DSN_" + strings.ToUpper(db.name[len(db.name)-6:])
	t.Setenv(name, db.dsn)
	return name
}

func (db *database) point(cfg *config.Config) {
	cfg.Sink.Kind, cfg.Sink.Schema = config.SinkPostgres, "app"
}

func (db *database) table(name string) string { return "app." + name }

func (db *database) createEffects(t *testing.T) { db.exec(t, "CREATE SCHEMA app", effectsTable) }

func (db *database) createPipeline(t *testing.T) {
	db.exec(t, "CREATE SCHEMA app",
		"CREATE TABLE app.orders (order_id text PRIMARY KEY, status text, version int)",
		"CREATE TABLE app.projected (seq bigserial PRIMARY KEY, event_id text NOT NULL, source_id text NOT NULL, version int, hdr text)")
}

func (db *database) seam(t *testing.T) sink.DB { return postgres.New(db.pool) }

func (db *database) runtimeSessions(t *testing.T) int {
	return db.queryInt(t, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'idc-runtime'", db.name)
}

func (db *database) effects(t *testing.T, table, idCol string) (rows, ids, doubled int) {
	t.Helper()
	tbl, col := pgx.Identifier{"app", table}.Sanitize(), pgx.Identifier{idCol}.Sanitize()
	rows = db.queryInt(t, "SELECT count(*) FROM "+tbl)
	ids = db.queryInt(t, "SELECT count(DISTINCT "+col+") FROM "+tbl)
	doubled = db.queryInt(t, "SELECT count(*) FROM (SELECT "+col+" FROM "+tbl+" GROUP BY 1 HAVING count(*) > 1) d")
	return rows, ids, doubled
}

func (db *database) offPayload(t *testing.T) int {
	return db.queryInt(t, "SELECT count(*) FROM app.effects WHERE message_id <> 'evt-' || lpad(n::text, 6, '0')")
}

func (db *database) versions(t *testing.T, table, keyCol, seqCol string) map[string]int {
	t.Helper()
	rows, err := db.pool.Query(context.Background(), "SELECT "+pgx.Identifier{keyCol}.Sanitize()+", "+pgx.Identifier{seqCol}.Sanitize()+
		" FROM "+pgx.Identifier{"app", table}.Sanitize())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var k string
		var v int
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func (db *database) claims(t *testing.T, inboxTable string) (rows, distinct int) {
	tbl := pgx.Identifier{"app", inboxTable}.Sanitize()
	return db.queryInt(t, "SELECT count(*) FROM "+tbl), db.queryInt(t, "SELECT count(DISTINCT message_id) FROM "+tbl)
}

func (db *database) claimedIDs(t *testing.T, inboxTable string) []string {
	t.Helper()
	var ids []string
	if err := db.pool.QueryRow(context.Background(), "SELECT coalesce(array_agg(message_id), '{}') FROM "+pgx.Identifier{"app", inboxTable}.Sanitize()).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	return ids
}

func (db *database) countClaimed(t *testing.T, inboxTable string, ids []string) int {
	return db.queryInt(t, "SELECT count(*) FROM "+pgx.Identifier{"app", inboxTable}.Sanitize()+" WHERE message_id = ANY($1)", ids)
}

func (db *database) claimedBefore(t *testing.T, inboxTable string, cutoff time.Time) int {
	return db.queryInt(t, "SELECT count(*) FROM "+pgx.Identifier{"app", inboxTable}.Sanitize()+" WHERE processed_at < $1", cutoff)
}

func (db *database) staleProgress(t *testing.T, progressTable string, after time.Duration) int {
	return db.queryInt(t, "SELECT count(*) FROM "+pgx.Identifier{"app", progressTable}.Sanitize()+
		" WHERE NOT stopped AND now() - heartbeat_at > make_interval(secs => $1)", after.Seconds())
}
