package chaos

import (
	"context"
	"testing"

	"github.com/idempotency-dev/idc-operator/runtime/config"
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
