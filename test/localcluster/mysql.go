package localcluster

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	sinkmysql "github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
)

// MySQLSink is a MariaDB database made for one e2e resource, with an
// account of its own holding the controller's grant on it and nothing
// else (the account both the manager and the runtime use, through one
// Secret).
type MySQLSink struct {
	Database string
	// User and password of the account; HostDSN reaches the server from
	// the host, PodDSN from pods (the node forwards 3306 on the bridge
	// gateway, as it forwards PostgreSQL's 5432).
	User, password  string
	HostDSN, PodDSN string
	effectTable     string
}

// PrepareMySQLSink creates database name (dropping one left over), the
// account idc_<name> with a random password and the controller's grant on
// the database (sink/mysql.ControllerGrants), and the effect table of the
// orders scenario: order_id, status, version, keyed by order_id.
func PrepareMySQLSink(ctx context.Context, name, effectTable string) (*MySQLSink, error) {
	admin, err := sql.Open("mysql", mysqltest.AdminDSN())
	if err != nil {
		return nil, err
	}
	defer func() { _ = admin.Close() }()
	if err := admin.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("MariaDB is not reachable on 127.0.0.1:3306 (start it with: make services): %w", err)
	}
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	s := &MySQLSink{Database: name, User: "idc_" + name, password: hex.EncodeToString(b), effectTable: effectTable}
	if len(s.User) > 32 { // MariaDB's user name limit (80 on 10.6+, 32 on MySQL 8)
		s.User = s.User[:32]
	}
	account := "'" + s.User + "'@'%'"
	stmts := []string{
		"DROP DATABASE IF EXISTS `" + name + "`",
		"DROP USER IF EXISTS " + account,
		"CREATE DATABASE `" + name + "`",
		"CREATE USER " + account + " IDENTIFIED BY '" + s.password + "'",
	}
	stmts = append(stmts, sinkmysql.ControllerGrants(name, s.User+"@%")...)
	stmts = append(stmts, "CREATE TABLE `"+name+"`.`"+effectTable+"` (order_id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(32) NOT NULL, version BIGINT NOT NULL) ENGINE=InnoDB")
	for _, stmt := range stmts {
		if _, err := admin.ExecContext(ctx, stmt); err != nil {
			return nil, fmt.Errorf("running %q: %w", strings.ReplaceAll(stmt, s.password, "<password>"), err)
		}
	}
	dsn := func(addr string) string {
		c := mysql.NewConfig()
		c.User, c.Passwd, c.Net, c.Addr, c.DBName = s.User, s.password, "tcp", addr, name
		return c.FormatDSN()
	}
	s.HostDSN, s.PodDSN = dsn("127.0.0.1:3306"), dsn(BridgeIP+":3306")
	return s, nil
}

// Drop removes the database and the account.
func (s *MySQLSink) Drop(ctx context.Context) error {
	admin, err := sql.Open("mysql", mysqltest.AdminDSN())
	if err != nil {
		return err
	}
	defer func() { _ = admin.Close() }()
	for _, stmt := range []string{"DROP DATABASE IF EXISTS `" + s.Database + "`", "DROP USER IF EXISTS '" + s.User + "'@'%'"} {
		if _, err := admin.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("running %q: %w", stmt, err)
		}
	}
	return nil
}

// Tables lists the database's tables.
func (s *MySQLSink) Tables(ctx context.Context) (map[string]bool, error) {
	db, err := sql.Open("mysql", s.HostDSN)
	if err != nil {
		return nil, err
	}
	defer func() { _ = db.Close() }()
	rows, err := db.QueryContext(ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = ?", s.Database)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }()
	out := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out[n] = true
	}
	return out, rows.Err()
}

// Verify reads the inbox (inboxTable), its dead letters and the effect
// table, as Workload.Verify does on PostgreSQL.
func (s *MySQLSink) Verify(ctx context.Context, w *Workload, inboxTable string) (Outcome, error) {
	db, err := sql.Open("mysql", s.HostDSN)
	if err != nil {
		return Outcome{}, err
	}
	defer func() { _ = db.Close() }()
	q := func(t string) string { return "`" + s.Database + "`.`" + t + "`" }
	o := Outcome{UniqueIDs: len(w.UniqueIDs), Orders: len(w.Latest)}
	ids := map[string]bool{}
	for _, id := range w.UniqueIDs {
		ids[id] = true
	}
	// The inbox also holds the epoch marker row (an id starting with NUL):
	// count only the workload's ids.
	rows, err := db.QueryContext(ctx, "SELECT message_id FROM "+q(inboxTable))
	if err != nil {
		return o, fmt.Errorf("reading the inbox: %w", err)
	}
	for rows.Next() {
		var id []byte
		if err := rows.Scan(&id); err != nil {
			_ = rows.Close()
			return o, err
		}
		if ids[string(id)] {
			o.InboxRows++
		}
	}
	_ = rows.Close()
	if err := rows.Err(); err != nil {
		return o, err
	}
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+q(sinkmysqlDeadLetters(inboxTable))).Scan(&o.DeadLetterRows); err != nil {
		return o, fmt.Errorf("counting dead letters: %w", err)
	}
	proj, err := db.QueryContext(ctx, "SELECT order_id, status, version FROM "+q(s.effectTable))
	if err != nil {
		return o, fmt.Errorf("reading the projection: %w", err)
	}
	defer func() { _ = proj.Close() }()
	return o, w.checkProjection(func(e *OrderEvent) (bool, error) {
		if !proj.Next() {
			return false, proj.Err()
		}
		var version int64
		if err := proj.Scan(&e.OrderID, &e.Status, &version); err != nil {
			return false, err
		}
		e.Version = int(version)
		return true, nil
	}, &o)
}

// sinkmysqlDeadLetters is the default dead-letter table of an inbox on
// MySQL (names over 64 characters are shortened with a hash).
func sinkmysqlDeadLetters(inboxTable string) string {
	return inbox.DerivedNameMax(inboxTable, "_dead_letters", sinkmysql.MaxIdentifier)
}
