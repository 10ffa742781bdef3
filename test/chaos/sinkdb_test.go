package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
)

// sinkDB is the sink database of one chaos run: the same run (TestChaos)
// goes once on PostgreSQL (*database) and once on MariaDB (*mariaDB,
// sink.kind mysql). Each creates its tables with its own DDL, cuts the
// runtime's sessions its own way, and checks the verdict with its own SQL.
type sinkDB interface {
	// dialect labels the run and its CHAOS line: "postgres" or "mariadb".
	dialect() string
	// runtimeDSN is the DSN the replicas get (sink.dsnEnv).
	runtimeDSN() string
	// point sets cfg's sink kind, and its schema to where the tables are
	// (on MariaDB the database).
	point(cfg *config.Config)
	// createTables creates the append and upsert targets and the
	// upsert's change log.
	createTables(t *testing.T)
	// newCutter returns what cuts the runtime's sessions.
	newCutter(t *testing.T) cutter
	// check loads the published events and proves the verdict from the
	// database alone.
	check(ctx context.Context, published []event) (verdict, error)

	// For TestCheckerCatchesViolations: statements of the dialect, a
	// table of the run qualified and quoted, a quoted column, and the
	// sink database through the runtime's seam.
	exec(t *testing.T, stmts ...string)
	table(name string) string
	col(name string) string
	seam(t *testing.T) sink.DB
}

// cutter ends every session the runtime holds on the run's database, as an
// operator's kill, a failover or a proxy restart would, and returns how
// many it ended.
type cutter interface {
	cut(ctx context.Context) (int, error)
}

// sinkDBs create the run's database on each dialect.
var sinkDBs = []func(*testing.T) sinkDB{
	func(t *testing.T) sinkDB { return newDatabase(t) },
	func(t *testing.T) sinkDB { return newMariaDB(t) },
}

// The sinkDB of PostgreSQL: schema chaos, cut by pg_terminate_backend.
var _ sinkDB = (*database)(nil)

func (db *database) dialect() string { return "postgres" }

func (db *database) runtimeDSN() string { return db.dsn }

func (db *database) point(cfg *config.Config) {
	cfg.Sink.Kind, cfg.Sink.Schema = config.SinkPostgres, "chaos"
}

func (db *database) createTables(t *testing.T) { db.exec(t, schemaDDL...) }

func (db *database) newCutter(t *testing.T) cutter { return newConnectionCutter(t, db.name) }

func (db *database) table(name string) string { return pgx.Identifier{"chaos", name}.Sanitize() }

func (db *database) col(name string) string { return pgx.Identifier{name}.Sanitize() }

func (db *database) seam(t *testing.T) sink.DB { return postgres.New(db.pool) }

// TestCheckerCatchesViolations writes, on each sink database, a state with
// every kind of violation the checker counts, and requires the checker to
// count each: the CHAOS line's zeros mean something on both dialects.
func TestCheckerCatchesViolations(t *testing.T) {
	for _, newDB := range sinkDBs {
		db := newDB(t)
		t.Run(db.dialect(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			db.createTables(t)
			s := &stream{name: "CHECKER", subject: "checker"}
			// The inboxes as the runtime migrates them; e1..e3 claimed by
			// the append consumer (e4 never: lost), all four by the upsert.
			for _, c := range []struct {
				cfg *config.Config
				ids []string
			}{{appendConfig(s), []string{"e1", "e2", "e3"}}, {upsertConfig(s), []string{"e1", "e2", "e3", "e4"}}} {
				db.point(c.cfg)
				claim(ctx, t, db.seam(t), c.cfg, c.ids)
			}
			published := []event{
				{EventID: "e1", Key: "k1", Version: 1, Status: "a"}, {EventID: "e2", Key: "k1", Version: 2, Status: "b"},
				{EventID: "e3", Key: "k2", Version: 1, Status: "a"}, {EventID: "e4", Key: "k3", Version: 1, Status: "a"},
			}
			ev, or, k := db.table("events"), db.table("orders"), db.col("key")
			db.exec(t,
				// e2 applied twice, e4 never, e9 never published.
				"INSERT INTO "+ev+" (event_id, "+k+", version, n) VALUES ('e1', 'k1', 1, 0), ('e2', 'k1', 2, 1), ('e2', 'k1', 2, 1), ('e3', 'k2', 1, 2), ('e9', 'k9', 1, 9)",
				// k1 moved back from v2 to v1 (a backward change, and below
				// its top), k2 right, k3 not e4's state.
				"INSERT INTO "+or+" ("+k+", version, status, event_id) VALUES ('k1', 2, 'b', 'e2'), ('k2', 1, 'a', 'e3'), ('k3', 1, 'zzz', 'e4')",
				"UPDATE "+or+" SET version = 1, status = 'a', event_id = 'e1' WHERE "+k+" = 'k1'",
			)
			v, err := db.check(ctx, published)
			if err != nil {
				t.Fatal(err)
			}
			want := verdict{unique: 4, applied: 3, doubled: 1, lost: 1, stale: 3, phantom: 1, backwards: 1}
			t.Logf("%s: %s", db.dialect(), v.line(0, len(published), db.dialect()))
			if v != want {
				t.Errorf("checker on %s: %+v, want %+v", db.dialect(), v, want)
			}
		})
	}
}

// claim records ids in cfg's inbox through the seam, as the runtime's claim
// transaction does (migrating the inbox first).
func claim(ctx context.Context, t *testing.T, db sink.DB, cfg *config.Config, ids []string) {
	t.Helper()
	in, err := sink.InboxFor(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	claims := make([]inbox.Claim, len(ids))
	for i, id := range ids {
		claims[i] = inbox.Claim{MessageID: id, PublishedAt: time.Now()}
	}
	if _, err := in.Claim(ctx, tx, claims); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}
