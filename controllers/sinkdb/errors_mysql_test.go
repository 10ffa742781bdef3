package sinkdb

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// MySQL's error numbers map onto the reasons PostgreSQL's SQLSTATEs map
// onto, each checked on a real error from the MariaDB server (or the
// driver, for a connection refused and a DSN that does not parse), and no
// message ever holds the password or the connection string.
func TestClassifyMySQL(t *testing.T) {
	ctx := context.Background()
	ref := messagingv1alpha1.SecretKeyRef{Name: "orders-db", Key: "dsn"}
	database, _ := mysqltest.NewDatabase(t)
	admin := mysqlAdmin(t)
	if _, err := admin.ExecContext(ctx, "CREATE TABLE `"+database+"`.orders (id INT PRIMARY KEY, secret_note TEXT)"); err != nil {
		t.Fatal(err)
	}
	// A least-privilege account: SELECT on one column of orders only.
	dsn, _ := mysqlUser(t, admin, database, "GRANT SELECT (id) ON <db>.orders TO <user>")
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	password := cfg.Passwd
	least, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = least.Close() })
	query := func(db *sql.DB, stmt string) error {
		t.Helper()
		_, err := db.ExecContext(ctx, stmt)
		if err == nil {
			t.Fatalf("%s succeeded", stmt)
		}
		return err
	}
	ensure := func(dsn string) error {
		t.Helper()
		c := New()
		defer c.Pools().Close()
		_, err := c.Ensure(ctx, Target{Owner: "x", DSN: dsn, Claim: inbox.OwnerClaim{Owner: inbox.Owner{Name: "x", UID: "u"}},
			Sink: config.Sink{Kind: config.SinkMySQL, Schema: database, InboxTable: "inbox", Layout: config.LayoutTable}})
		if err == nil {
			t.Fatal("Ensure succeeded")
		}
		return err
	}
	// Through the Client a privilege refusal names the GRANT for the
	// account the server matched: the inbox migrated by root, read by the
	// least-privilege account.
	root := New()
	t.Cleanup(root.Pools().Close)
	inboxTarget := Target{Owner: "root", DSN: mysqltest.AdminDSN(), Claim: inbox.OwnerClaim{Owner: inbox.Owner{Name: "x", UID: "u"}},
		Sink: config.Sink{Kind: config.SinkMySQL, Schema: database, InboxTable: "inbox", Layout: config.LayoutTable}}
	if _, err := root.Ensure(ctx, inboxTarget); err != nil {
		t.Fatal(err)
	}
	inboxTarget.Owner, inboxTarget.DSN = "least", dsn
	_, clientErr := root.LastPrune(ctx, inboxTarget)
	if clientErr == nil {
		t.Fatal("LastPrune by an account without SELECT on the prune runs succeeded")
	}
	// The server tells only an account that may see it that a database
	// does not exist (others get 1044): root asks.
	adminCfg, err := gomysql.ParseDSN(mysqltest.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	adminCfg.DBName = database + "_gone"
	gone := adminCfg.FormatDSN()
	with := func(f func(*gomysql.Config)) string {
		c := cfg.Clone()
		f(c)
		return c.FormatDSN()
	}

	for _, tc := range []struct {
		name     string
		err      error
		number   uint16 // the server's error number; 0 for none
		reason   string
		contains []string
	}{
		{"1045 wrong password (Ensure)", ensure(with(func(c *gomysql.Config) { c.Passwd = "wrong-" + password })), 1045,
			messagingv1alpha1.ReasonAuthenticationFailed, []string{`Secret "orders-db" key "dsn"`, "check the user and password"}},
		{"1044 no access to the database (Ensure)", ensure(with(func(c *gomysql.Config) { c.DBName = "mysql" })), 1044,
			messagingv1alpha1.ReasonPermissionDenied, []string{"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX, LOCK TABLES ON `mysql`.* TO '" + cfg.User + "'@'%'"}},
		{"1142 table privilege", query(least, "INSERT INTO `"+database+"`.orders (id) VALUES (1)"), 1142,
			messagingv1alpha1.ReasonPermissionDenied, []string{"INSERT command denied"}},
		{"1142 through the Client", clientErr, 1142,
			messagingv1alpha1.ReasonPermissionDenied, []string{"run GRANT SELECT ON `" + database + "`.`inbox_prune_runs` TO '" + cfg.User + "'@'%'"}},
		{"1143 column privilege", query(least, "SELECT secret_note FROM `"+database+"`.orders"), 1143,
			messagingv1alpha1.ReasonPermissionDenied, []string{"secret_note"}},
		{"1227 a SUPER privilege", query(least, "SET GLOBAL max_connections = 500"), 1227,
			messagingv1alpha1.ReasonPermissionDenied, []string{"MySQL error 1227"}},
		{"1049 unknown database (Ensure)", ensure(gone), 1049,
			messagingv1alpha1.ReasonDatabaseError, []string{"does not exist", "CREATE DATABASE"}},
		{"1146 no such table", query(admin, "SELECT * FROM `"+database+"`.missing"), 1146,
			messagingv1alpha1.ReasonTableNotFound, []string{"missing"}},
		{"1054 no such column", query(admin, "SELECT nope FROM `"+database+"`.orders"), 1054,
			messagingv1alpha1.ReasonColumnNotFound, []string{"nope"}},
		{"connection refused (Ensure)", ensure(with(func(c *gomysql.Config) { c.Addr = "127.0.0.1:1" })), 0,
			messagingv1alpha1.ReasonDatabaseError, []string{"cannot reach", "retrying"}},
		{"a DSN that does not parse (Ensure)", ensure(cfg.User + ":" + password + "@tcp(127.0.0.1:3306/" + database), 0,
			messagingv1alpha1.ReasonInvalidDSN, []string{"cannot be parsed", "tcp(host:3306)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := mysqlErrorNumber(tc.err); got != tc.number {
				t.Fatalf("error %v is number %d, want %d", tc.err, got, tc.number)
			}
			reason, msg := Classify(tc.err, ref)
			t.Logf("%s: %s", reason, msg)
			if reason != tc.reason {
				t.Errorf("reason %s (%q), want %s", reason, msg, tc.reason)
			}
			for _, s := range tc.contains {
				if !strings.Contains(msg, s) {
					t.Errorf("message %q does not contain %q", msg, s)
				}
			}
			for _, never := range []string{password, "tcp(127.0.0.1"} {
				if strings.Contains(msg, never) || strings.Contains(tc.err.Error(), never) {
					t.Errorf("the message or error shows %q: %q / %v", never, msg, tc.err)
				}
			}
		})
	}
	if !IsDatabaseGone(ensure(gone)) {
		t.Error("IsDatabaseGone is false for MySQL's unknown database (1049)")
	}
	if !errors.Is(ensure("user:pw@tcp(127.0.0.1:3306"), ErrInvalidDSN) {
		t.Error("a DSN that does not parse is not ErrInvalidDSN")
	}
}
