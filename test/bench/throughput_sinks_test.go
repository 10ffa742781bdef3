package bench

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	_ "github.com/go-sql-driver/mysql" // the admin connection's driver

	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	sinkmysql "github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
)

// benchSink is the database a row's inbox and orders table live in: the
// environment's PostgreSQL database (every row but the MariaDB ones) or a
// MariaDB server. The rows' helpers (schema, checkResult, dbCeiling,
// runJetStream, startReplicas, ceilingPairs) run on t.sink, so the MariaDB
// rows are the PostgreSQL rows' code on another sink, not a copy of it.
type benchSink interface {
	// kind is the runtime config's sink.kind ("" for PostgreSQL, as the
	// PostgreSQL rows' configs always had it).
	kind() config.SinkKind
	// prefix starts the names of the rows and ratios on this sink ("" for
	// PostgreSQL: its lines are unchanged).
	prefix() string
	// dsn is what the replicas get in sink.dsnEnv.
	dsn() string
	// namespace is the row's schema (PostgreSQL) or database (MariaDB)
	// for the environment's n-th row.
	namespace(n int) string
	// create makes the namespace with the orders table.
	create(b *testing.B, ns string)
	// counts reads the row's result: the orders rows, those not at
	// version, and the inbox's message ids.
	counts(b *testing.B, ns string, version int) (rows, notLatest, inboxRows int)
	// claimed reads a partial row's result (the workload's ids are
	// <key>-v<version>): the orders rows, the keys with a claimed id,
	// those whose row is missing or not at the highest version claimed,
	// and the inbox's message ids.
	claimed(b *testing.B, ns string) (rows, claimedKeys, wrong, inboxRows int)
	// drop removes the namespace.
	drop(b *testing.B, ns string)
	// open is the sink database as the runtime uses it (runtime/sink),
	// with at most conns connections; the caller closes it.
	open(b *testing.B, conns int) sink.DB
}

// pgSink is the environment's PostgreSQL database (t.pool, t.dsn).
type pgSink struct{ t *throughputEnv }

func (pgSink) kind() config.SinkKind          { return "" }
func (pgSink) prefix() string                 { return "" }
func (s pgSink) dsn() string                  { return s.t.dsn }
func (pgSink) namespace(n int) string         { return fmt.Sprintf("t%d", n) }
func (s pgSink) open(*testing.B, int) sink.DB { return postgres.New(s.t.pool) }

func (s pgSink) create(b *testing.B, ns string) {
	b.Helper()
	for _, q := range []string{
		"CREATE SCHEMA " + ns,
		"CREATE TABLE " + ns + ".orders (key text PRIMARY KEY, version int NOT NULL, status text NOT NULL, amount numeric NOT NULL)",
	} {
		if _, err := s.t.pool.Exec(context.Background(), q); err != nil {
			b.Fatalf("running %q: %v", q, err)
		}
	}
}

func (s pgSink) counts(b *testing.B, ns string, version int) (rows, notLatest, inboxRows int) {
	b.Helper()
	err := s.t.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT
		(SELECT count(*) FROM %[1]s.orders), (SELECT count(*) FROM %[1]s.orders WHERE version <> $1),
		(SELECT count(*) FROM %[1]s.inbox)`, ns), version).Scan(&rows, &notLatest, &inboxRows)
	if err != nil {
		b.Fatal(err)
	}
	return rows, notLatest, inboxRows
}

func (s pgSink) claimed(b *testing.B, ns string) (rows, claimedKeys, wrong, inboxRows int) {
	b.Helper()
	err := s.t.pool.QueryRow(context.Background(), fmt.Sprintf(`WITH c AS (
			SELECT split_part(message_id, '-', 1) AS key, max(substr(split_part(message_id, '-', 2), 2)::int) AS version
			FROM %[1]s.inbox GROUP BY 1)
		SELECT (SELECT count(*) FROM %[1]s.orders), (SELECT count(*) FROM c),
			(SELECT count(*) FROM c LEFT JOIN %[1]s.orders o ON o.key = c.key WHERE o.version IS DISTINCT FROM c.version),
			(SELECT count(*) FROM %[1]s.inbox)`, ns)).Scan(&rows, &claimedKeys, &wrong, &inboxRows)
	if err != nil {
		b.Fatal(err)
	}
	return rows, claimedKeys, wrong, inboxRows
}

// drop also checkpoints: each row writes some 50 MB of WAL; left to
// max_wal_size, the checkpoints they trigger land in whichever later row
// happens to run then. One here starts every row from the same state.
func (s pgSink) drop(b *testing.B, ns string) {
	b.Helper()
	if _, err := s.t.pool.Exec(context.Background(), "DROP SCHEMA "+ns+" CASCADE"); err != nil {
		b.Fatalf("dropping schema %s: %v", ns, err)
	}
	if _, err := s.t.pool.Exec(context.Background(), "CHECKPOINT"); err != nil {
		b.Fatalf("checkpoint after row %s: %v", ns, err)
	}
}

// mariaSink is the machine's MariaDB (internal/mysqltest's server): a
// database per row, named after the benchmark's own database
// (idc_test_<random>_t<n>, so nothing else on the shared server is
// touched), each dropped after its row and at the end of the benchmark.
type mariaSink struct {
	base   string
	dsnStr string
	admin  *sql.DB
}

func newMariaSink(b *testing.B) *mariaSink {
	b.Helper()
	base, dsn := mysqltest.NewDatabase(b)
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = admin.Close() })
	return &mariaSink{base: base, dsnStr: dsn, admin: admin}
}

func (*mariaSink) kind() config.SinkKind    { return config.SinkMySQL }
func (*mariaSink) prefix() string           { return "mariadb_" }
func (s *mariaSink) dsn() string            { return s.dsnStr }
func (s *mariaSink) namespace(n int) string { return fmt.Sprintf("%s_t%d", s.base, n) }

func (s *mariaSink) exec(b *testing.B, q string) {
	b.Helper()
	if _, err := s.admin.ExecContext(context.Background(), q); err != nil {
		b.Fatalf("running %q: %v", q, err)
	}
}

func (s *mariaSink) create(b *testing.B, ns string) {
	b.Helper()
	s.exec(b, "CREATE DATABASE `"+ns+"`")
	b.Cleanup(func() { _, _ = s.admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS `"+ns+"`") })
	s.exec(b, "CREATE TABLE `"+ns+"`.orders (`key` VARCHAR(64) PRIMARY KEY, version INT NOT NULL, status VARCHAR(64) NOT NULL, amount DECIMAL(20,2) NOT NULL) ENGINE=InnoDB")
}

// counts leaves out the epoch marker row MySQL inboxes hold (an id
// starting with NUL: runtime/sink/mysql ddl.go).
func (s *mariaSink) counts(b *testing.B, ns string, version int) (rows, notLatest, inboxRows int) {
	b.Helper()
	err := s.admin.QueryRowContext(context.Background(), fmt.Sprintf("SELECT "+
		"(SELECT count(*) FROM `%[1]s`.orders), (SELECT count(*) FROM `%[1]s`.orders WHERE version <> ?), "+
		"(SELECT count(*) FROM `%[1]s`.inbox WHERE LEFT(message_id, 1) <> X'00')", ns), version).Scan(&rows, &notLatest, &inboxRows)
	if err != nil {
		b.Fatal(err)
	}
	return rows, notLatest, inboxRows
}

func (s *mariaSink) claimed(b *testing.B, ns string) (rows, claimedKeys, wrong, inboxRows int) {
	b.Helper()
	err := s.admin.QueryRowContext(context.Background(), fmt.Sprintf("WITH c AS ("+
		"SELECT SUBSTRING_INDEX(message_id, '-', 1) AS k, MAX(CAST(SUBSTRING(SUBSTRING_INDEX(message_id, '-', -1), 2) AS UNSIGNED)) AS v "+
		"FROM `%[1]s`.inbox WHERE LEFT(message_id, 1) <> X'00' GROUP BY 1) "+
		"SELECT (SELECT count(*) FROM `%[1]s`.orders), (SELECT count(*) FROM c), "+
		"(SELECT count(*) FROM c LEFT JOIN `%[1]s`.orders o ON o.`key` = CONVERT(c.k USING utf8mb4) WHERE NOT (o.version <=> c.v)), "+
		"(SELECT count(*) FROM `%[1]s`.inbox WHERE LEFT(message_id, 1) <> X'00')", ns)).Scan(&rows, &claimedKeys, &wrong, &inboxRows)
	if err != nil {
		b.Fatal(err)
	}
	return rows, claimedKeys, wrong, inboxRows
}

func (s *mariaSink) drop(b *testing.B, ns string) {
	b.Helper()
	s.exec(b, "DROP DATABASE `"+ns+"`")
}

func (s *mariaSink) open(b *testing.B, conns int) sink.DB {
	b.Helper()
	d, err := sinkmysql.Open(context.Background(), s.dsnStr)
	if err != nil {
		b.Fatalf("MariaDB is required for the MariaDB rows: %v", err)
	}
	d.SetMaxConns(conns)
	return d
}

// onSink runs fn with the rows on s, then puts the environment's sink
// back.
func (t *throughputEnv) onSink(s benchSink, fn func()) {
	saved := t.sink
	t.sink = s
	defer func() { t.sink = saved }()
	fn()
}

// rowName is name as printed for the current sink.
func (t *throughputEnv) rowName(name string) string { return t.sink.prefix() + name }
