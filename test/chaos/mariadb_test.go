package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
)

// mariaDB is the run's MariaDB database (internal/mysqltest), which is also
// the config's sink.schema (sink.kind mysql). The replicas' DSN names it as
// their default database; the test's own connections name none and qualify
// every table, so the processlist tells the runtime's sessions (DB = the
// database) from the test's, as application_name does on PostgreSQL.
type mariaDB struct {
	name   string
	dsn    string  // the replicas'
	ownDSN string  // the test's
	db     *sql.DB // the test's
}

var _ sinkDB = (*mariaDB)(nil)

func newMariaDB(t *testing.T) *mariaDB {
	t.Helper()
	name, dsn := mysqltest.NewDatabase(t)
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName, cfg.ParseTime, cfg.Loc, cfg.InterpolateParams = "", true, time.UTC, true
	own := cfg.FormatDSN()
	db, err := sql.Open("mysql", own)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return &mariaDB{name: name, dsn: dsn, ownDSN: own, db: db}
}

func (m *mariaDB) dialect() string { return "mariadb" }

func (m *mariaDB) runtimeDSN() string { return m.dsn }

func (m *mariaDB) point(cfg *config.Config) {
	cfg.Sink.Kind, cfg.Sink.Schema = config.SinkMySQL, m.name
}

// tbl is a table of the run's database, qualified and quoted.
func (m *mariaDB) tbl(name string) string { return "`" + m.name + "`.`" + name + "`" }

func (m *mariaDB) table(name string) string { return m.tbl(name) }

func (m *mariaDB) col(name string) string { return "`" + name + "`" }

func (m *mariaDB) exec(t *testing.T, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := m.db.ExecContext(context.Background(), s); err != nil {
			t.Fatalf("running %q: %v", s, err)
		}
	}
}

// seam opens the database through the runtime's seam, on the test's DSN
// (no default database).
func (m *mariaDB) seam(t *testing.T) sink.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := mysql.Open(ctx, m.ownDSN)
	if err != nil {
		t.Fatalf("opening the seam on MariaDB: %v", err)
	}
	t.Cleanup(d.Close)
	return d
}

// createTables: the same tables as PostgreSQL's schemaDDL. Event ids are
// VARBINARY like the inbox's message_id, so the checker's joins compare
// bytes on both sides and use the indexes. MariaDB fires a row's UPDATE
// trigger on INSERT … ON DUPLICATE KEY UPDATE even when the gated
// assignments leave it as it was; the log records real changes only, as
// PostgreSQL's (whose gate is a WHERE) does.
func (m *mariaDB) createTables(t *testing.T) {
	t.Helper()
	for _, s := range []string{
		`CREATE TABLE ` + m.tbl("events") + ` (seq BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARBINARY(255) NOT NULL,
			` + "`key`" + ` VARCHAR(255) NOT NULL, version INT NOT NULL, n INT NOT NULL) ENGINE=InnoDB`,
		`CREATE TABLE ` + m.tbl("orders") + ` (` + "`key`" + ` VARCHAR(255) PRIMARY KEY, version INT NOT NULL,
			status VARCHAR(255) NOT NULL, event_id VARBINARY(255) NOT NULL) ENGINE=InnoDB`,
		`CREATE TABLE ` + m.tbl("order_changes") + ` (` + "`key`" + ` VARCHAR(255) NOT NULL, old_version INT NULL,
			new_version INT NOT NULL) ENGINE=InnoDB`,
		`CREATE TRIGGER ` + m.tbl("log_insert") + ` AFTER INSERT ON ` + m.tbl("orders") + ` FOR EACH ROW
			INSERT INTO ` + m.tbl("order_changes") + " VALUES (NEW.`key`, NULL, NEW.version)",
		`CREATE TRIGGER ` + m.tbl("log_update") + ` AFTER UPDATE ON ` + m.tbl("orders") + ` FOR EACH ROW
			INSERT INTO ` + m.tbl("order_changes") + " SELECT NEW.`key`, OLD.version, NEW.version FROM DUAL" + `
			WHERE NOT (OLD.version <=> NEW.version AND OLD.status <=> NEW.status AND OLD.event_id <=> NEW.event_id)`,
	} {
		if _, err := m.db.ExecContext(context.Background(), s); err != nil {
			t.Fatalf("running %q: %v", s, err)
		}
	}
}

// sessionCutter kills the runtime's sessions with KILL CONNECTION, MariaDB's
// pg_terminate_backend: the connection is closed under whatever it runs
// (a claim, an effect, a COMMIT in flight).
type sessionCutter struct {
	db     *sql.DB
	dbName string
}

func (m *mariaDB) newCutter(t *testing.T) cutter { return &sessionCutter{db: m.db, dbName: m.name} }

func (c *sessionCutter) cut(ctx context.Context) (int, error) {
	rows, err := c.db.QueryContext(ctx, "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()", c.dbName)
	if err != nil {
		return 0, fmt.Errorf("while listing the runtime's sessions: %w", err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			_ = rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, fmt.Errorf("while listing the runtime's sessions: %w", err)
	}
	n := 0
	for _, id := range ids {
		_, err := c.db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id))
		var me *gomysql.MySQLError
		if errors.As(err, &me) && me.Number == 1094 { // unknown thread: it ended meanwhile
			continue
		}
		if err != nil {
			return n, fmt.Errorf("while killing session %d: %w", id, err)
		}
		n++
	}
	return n, nil
}

// check: PostgreSQL's checks (checker_test.go) in MariaDB's SQL. The
// inbox's epoch marker row (runtime/sink/mysql) is no claim.
func (m *mariaDB) check(ctx context.Context, published []event) (verdict, error) {
	if err := m.loadPublished(ctx, published); err != nil {
		return verdict{}, err
	}
	p, e, o := m.tbl("published"), m.tbl("events"), m.tbl("orders")
	claimed := func(inbox string) string {
		return `(EXISTS (SELECT 1 FROM ` + m.tbl(inbox) + ` i WHERE i.message_id = p.event_id)
		      OR EXISTS (SELECT 1 FROM ` + m.tbl(inbox+"_dead_letters") + ` d WHERE d.message_id = p.event_id))`
	}
	notPublished := func(table, col string) string {
		return `(SELECT COUNT(*) FROM ` + m.tbl(table) + ` x WHERE x.` + col + ` NOT LIKE CONCAT(CHAR(0), 'idc-epoch:%')
			AND NOT EXISTS (SELECT 1 FROM ` + p + ` p WHERE p.event_id = x.` + col + `))`
	}
	var v verdict
	var staleKeys int
	for _, q := range []struct {
		dst *int
		sql string
	}{
		{&v.unique, "SELECT COUNT(*) FROM " + p},
		{&v.applied, "SELECT COUNT(DISTINCT e.event_id) FROM " + e + " e JOIN " + p + " p ON p.event_id = e.event_id"},
		{&v.doubled, "SELECT COUNT(*) FROM (SELECT event_id FROM " + e + " GROUP BY event_id HAVING COUNT(*) > 1) d"},
		{&v.lost, "SELECT COUNT(*) FROM " + p + " p WHERE NOT " + claimed(appendInbox) + " OR NOT " + claimed(upsertInbox) + `
			OR NOT (EXISTS (SELECT 1 FROM ` + e + ` e WHERE e.event_id = p.event_id)
			     OR EXISTS (SELECT 1 FROM ` + m.tbl(appendInbox+"_dead_letters") + ` d WHERE d.message_id = p.event_id))`},
		{&staleKeys, "SELECT COUNT(*) FROM (SELECT `key`, MAX(version) AS top FROM " + p + " GROUP BY `key`) h" + `
			LEFT JOIN ` + o + " o ON o.`key` = h.`key`" + `
			WHERE o.` + "`key`" + ` IS NULL OR o.version < h.top
			   OR NOT EXISTS (SELECT 1 FROM ` + p + ` p
			                  WHERE p.event_id = o.event_id AND p.` + "`key` = o.`key`" + ` AND p.version = o.version AND p.status = o.status)`},
		{&v.backwards, "SELECT COUNT(*) FROM " + m.tbl("order_changes") + " WHERE old_version >= new_version"},
		{&v.phantom, "SELECT " + notPublished("events", "event_id") + " + " + notPublished(appendInbox, "message_id") + " + " + notPublished(upsertInbox, "message_id")},
		{&v.deadLetters, "SELECT (SELECT COUNT(*) FROM " + m.tbl(appendInbox+"_dead_letters") + ") + (SELECT COUNT(*) FROM " + m.tbl(upsertInbox+"_dead_letters") + ")"},
	} {
		if err := m.db.QueryRowContext(ctx, q.sql).Scan(q.dst); err != nil {
			return v, fmt.Errorf("running %q: %w", q.sql, err)
		}
	}
	v.stale = staleKeys + v.backwards
	return v, nil
}

// loadPublished creates the published table and inserts the events in
// multi-row INSERTs (MariaDB has no COPY).
func (m *mariaDB) loadPublished(ctx context.Context, published []event) error {
	p := m.tbl("published")
	if _, err := m.db.ExecContext(ctx, `CREATE TABLE `+p+` (event_id VARBINARY(255) PRIMARY KEY, `+"`key`"+` VARCHAR(255) NOT NULL,
		version INT NOT NULL, status VARCHAR(255) NOT NULL, KEY key_version (`+"`key`"+`, version)) ENGINE=InnoDB`); err != nil {
		return fmt.Errorf("creating the published table: %w", err)
	}
	const chunk = 1000
	for i := 0; i < len(published); i += chunk {
		part := published[i:min(i+chunk, len(published))]
		args := make([]any, 0, 4*len(part))
		for _, e := range part {
			args = append(args, []byte(e.EventID), e.Key, e.Version, e.Status)
		}
		q := "INSERT INTO " + p + " (event_id, `key`, version, status) VALUES (?,?,?,?)" + strings.Repeat(",(?,?,?,?)", len(part)-1)
		if _, err := m.db.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("loading the published table: %w", err)
		}
	}
	for _, stmt := range []string{
		"CREATE INDEX events_event_id ON " + m.tbl("events") + " (event_id)",
		"ANALYZE TABLE " + p + ", " + m.tbl("events") + ", " + m.tbl("orders"),
	} {
		if _, err := m.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("preparing the checks (%s): %w", stmt, err)
		}
	}
	return nil
}
