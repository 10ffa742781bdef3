package mysql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"

	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
	"github.com/idempotency-dev/idc-operator/runtime/sink/sinktest"
)

func harness(opts ...mysql.Option) sinktest.Harness {
	q := func(schema, table string) string { return "`" + schema + "`.`" + table + "`" }
	db := func(d sink.DB) *sql.DB { return d.(*mysql.DB).SQL() }
	exec := func(t *testing.T, d sink.DB, stmt string, args ...any) {
		t.Helper()
		if _, err := db(d).ExecContext(context.Background(), stmt, args...); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	return sinktest.Harness{
		Open: func(t *testing.T) (sink.DB, string) {
			name, dsn := mysqltest.NewDatabase(t)
			d, err := mysql.Open(context.Background(), dsn, opts...)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			t.Cleanup(d.Close)
			return d, name
		},
		CreateOrders: func(t *testing.T, d sink.DB, schema, table string) {
			exec(t, d, "CREATE TABLE "+q(schema, table)+" (order_id VARCHAR(64) PRIMARY KEY, status TEXT, version BIGINT NULL)")
			exec(t, d, "CREATE TABLE "+q(schema, table+"_events")+" (event_id VARCHAR(64), order_id VARCHAR(64))")
		},
		Orders: func(t *testing.T, d sink.DB, schema, table string) map[string]sinktest.Order {
			rows, err := db(d).QueryContext(context.Background(), "SELECT order_id, status, COALESCE(version, -1) FROM "+q(schema, table))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = rows.Close() }()
			out := map[string]sinktest.Order{}
			for rows.Next() {
				var id string
				var o sinktest.Order
				if err := rows.Scan(&id, &o.Status, &o.Version); err != nil {
					t.Fatal(err)
				}
				out[id] = o
			}
			return out
		},
		Count: func(t *testing.T, d sink.DB, schema, table string) int {
			var n int
			// The inbox's epoch marker row (its id starts with NUL) is not
			// a claim; tables without message_id are counted whole.
			err := db(d).QueryRowContext(context.Background(), "SELECT COUNT(*) FROM "+q(schema, table)+
				" WHERE message_id IS NULL OR LEFT(message_id, 1) <> CHAR(0)").Scan(&n)
			var me *driver.MySQLError
			if errors.As(err, &me) && me.Number == 1054 {
				err = db(d).QueryRowContext(context.Background(), "SELECT COUNT(*) FROM "+q(schema, table)).Scan(&n)
			}
			if err != nil {
				t.Fatal(err)
			}
			return n
		},
		Age: func(t *testing.T, d sink.DB, schema, table string, ids []string, by time.Duration) {
			for _, id := range ids {
				exec(t, d, "UPDATE "+q(schema, table)+" SET processed_at = processed_at - INTERVAL ? MICROSECOND WHERE message_id = ?", by.Microseconds(), []byte(id))
			}
		},
		OpenAs: func(t *testing.T, d sink.DB, schema string, n inbox.Names, layout config.Layout, without sinktest.Revoke, inboxOpts ...inbox.Option) sink.DB {
			return openAs(t, d, schema, n, layout, without, inboxOpts, opts...)
		},
		Advice: func(_ sink.DB, err error) string {
			var pe *mysql.PrivilegeError
			if errors.As(err, &pe) {
				return pe.Grant
			}
			return ""
		},
	}
}

// TestConformance runs the sink conformance suite on the real MariaDB with
// the strategy the server gets (INSERT IGNORE … RETURNING on MariaDB 10.5+).
func TestConformance(t *testing.T) { sinktest.Run(t, harness()) }

// TestConformanceCountingClaim runs it again with MySQL 8's claim (no
// RETURNING: read, insert, check the count), which MariaDB runs the same.
func TestConformanceCountingClaim(t *testing.T) {
	sinktest.Run(t, harness(mysql.WithClaimStrategy(mysql.ClaimCount)))
}

// openAs creates the login 'idc_rt_<random>'@'%' holding exactly
// mysql.RuntimeGrants with the inbox's options inboxOpts (less without) and
// opens the database as it; the login is dropped when the test ends.
func openAs(t *testing.T, d sink.DB, schema string, n inbox.Names, layout config.Layout, without sinktest.Revoke, inboxOpts []inbox.Option, opts ...mysql.Option) sink.DB {
	t.Helper()
	admin := d.(*mysql.DB).SQL()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	user, password := "idc_rt_"+hex.EncodeToString(b[:4]), hex.EncodeToString(b)
	c := context.Background()
	run := func(stmt string) {
		t.Helper()
		if _, err := admin.ExecContext(c, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	run("CREATE USER '" + user + "'@'%' IDENTIFIED BY '" + password + "'")
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP USER IF EXISTS '"+user+"'@'%'") })
	for _, g := range mysql.RuntimeGrants(n, layout, user+"@%", inboxOpts...) {
		run(g)
	}
	if without.Privilege != "" {
		run("REVOKE " + without.Privilege + " ON " + mysql.Quote(schema) + "." + mysql.Quote(without.Table) + " FROM '" + user + "'@'%'")
	}
	cfg, err := driver.ParseDSN(mysqltest.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd, cfg.DBName = user, password, schema
	rt, err := mysql.Open(c, cfg.FormatDSN(), opts...)
	if err != nil {
		t.Fatalf("Open as %s: %v", user, err)
	}
	t.Cleanup(rt.Close)
	if rt.Account() != user+"@%" {
		t.Fatalf("Account() = %q, want %s@%%", rt.Account(), user)
	}
	return rt
}
