package integration

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
)

// mariaDB is the sinkDB of MariaDB (sink.kind mysql): a database private to
// the test (internal/mysqltest), which is also the config's sink.schema.
// The runtime's DSN names it as its default database; the test's own
// connections name none and qualify every table, so the processlist tells
// the runtime's sessions (db = the database) from the test's.
type mariaDB struct {
	name   string
	dsn    string  // the runtime's
	db     *sql.DB // the test's
	seamDB *mysql.DB
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seam, err := mysql.Open(ctx, own)
	if err != nil {
		t.Fatalf("opening the seam on MariaDB: %v", err)
	}
	t.Cleanup(seam.Close)
	return &mariaDB{name: name, dsn: dsn, db: db, seamDB: seam}
}

func (m *mariaDB) dialect() string { return "mariadb" }

func (m *mariaDB) setDSNEnv(t *testing.T) string {
	t.Helper()
	env := "IDC_INTEGRATION_DSN_" + strings.ToUpper(m.name[len(m.name)-6:])
	t.Setenv(env, m.dsn)
	return env
}

func (m *mariaDB) point(cfg *config.Config) {
	cfg.Sink.Kind, cfg.Sink.Schema = config.SinkMySQL, m.name
}

func (m *mariaDB) table(name string) string { return "`" + m.name + "`.`" + name + "`" }

func (m *mariaDB) exec(t *testing.T, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := m.db.ExecContext(context.Background(), s); err != nil {
			t.Fatalf("running %q: %v", s, err)
		}
	}
}

func (m *mariaDB) queryInt(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := m.db.QueryRowContext(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("running %q: %v", q, err)
	}
	return n
}

func (m *mariaDB) createEffects(t *testing.T) {
	m.exec(t, "CREATE TABLE "+m.table("effects")+
		" (seq BIGINT AUTO_INCREMENT PRIMARY KEY, message_id VARCHAR(255) NOT NULL, n INT NOT NULL) ENGINE=InnoDB")
}

func (m *mariaDB) createPipeline(t *testing.T) {
	m.exec(t,
		"CREATE TABLE "+m.table("orders")+" (order_id VARCHAR(255) PRIMARY KEY, status TEXT, version INT) ENGINE=InnoDB",
		"CREATE TABLE "+m.table("projected")+` (seq BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(255) NOT NULL,
			source_id VARCHAR(255) NOT NULL, version INT, hdr TEXT) ENGINE=InnoDB`)
}

func (m *mariaDB) seam(t *testing.T) sink.DB { return m.seamDB }

func (m *mariaDB) runtimeSessions(t *testing.T) int {
	return m.queryInt(t, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = ?", m.name)
}

func (m *mariaDB) effects(t *testing.T, table, idCol string) (rows, ids, doubled int) {
	t.Helper()
	tbl, col := m.table(table), "`"+idCol+"`"
	rows = m.queryInt(t, "SELECT COUNT(*) FROM "+tbl)
	ids = m.queryInt(t, "SELECT COUNT(DISTINCT "+col+") FROM "+tbl)
	doubled = m.queryInt(t, "SELECT COUNT(*) FROM (SELECT "+col+" FROM "+tbl+" GROUP BY "+col+" HAVING COUNT(*) > 1) d")
	return rows, ids, doubled
}

func (m *mariaDB) offPayload(t *testing.T) int {
	return m.queryInt(t, "SELECT COUNT(*) FROM "+m.table("effects")+" WHERE message_id <> CONCAT('evt-', LPAD(n, 6, '0'))")
}

func (m *mariaDB) versions(t *testing.T, table, keyCol, seqCol string) map[string]int {
	t.Helper()
	rows, err := m.db.QueryContext(context.Background(), "SELECT `"+keyCol+"`, `"+seqCol+"` FROM "+m.table(table))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
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

// notMarker leaves out the inbox's epoch marker row (mysql ddl.go), which
// is no claim.
const notMarker = "message_id NOT LIKE CONCAT(CHAR(0), 'idc-epoch:%')"

func (m *mariaDB) claims(t *testing.T, inboxTable string) (rows, distinct int) {
	tbl := m.table(inboxTable)
	return m.queryInt(t, "SELECT COUNT(*) FROM "+tbl+" WHERE "+notMarker),
		m.queryInt(t, "SELECT COUNT(DISTINCT message_id) FROM "+tbl+" WHERE "+notMarker)
}

func (m *mariaDB) claimedIDs(t *testing.T, inboxTable string) []string {
	t.Helper()
	rows, err := m.db.QueryContext(context.Background(), "SELECT message_id FROM "+m.table(inboxTable)+" WHERE "+notMarker)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id []byte
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, string(id))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

func (m *mariaDB) countClaimed(t *testing.T, inboxTable string, ids []string) int {
	if len(ids) == 0 {
		return 0
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = []byte(id) // message_id is VARBINARY
	}
	return m.queryInt(t, "SELECT COUNT(*) FROM "+m.table(inboxTable)+" WHERE message_id IN (?"+strings.Repeat(",?", len(ids)-1)+")", args...)
}

func (m *mariaDB) claimedBefore(t *testing.T, inboxTable string, cutoff time.Time) int {
	return m.queryInt(t, "SELECT COUNT(*) FROM "+m.table(inboxTable)+" WHERE processed_at < ? AND "+notMarker, cutoff.UTC())
}

func (m *mariaDB) staleProgress(t *testing.T, progressTable string, after time.Duration) int {
	return m.queryInt(t, "SELECT COUNT(*) FROM "+m.table(progressTable)+
		" WHERE NOT stopped AND heartbeat_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND", after.Microseconds())
}
