package sinkdb

import (
	"context"
	"database/sql"
	"errors"
	"regexp"
	"strings"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// mysqlUser creates the login 'idc_pf_<random>'@'%' with the grants (each
// "GRANT … ON <db>.… TO" with <db> the database and <user> the account),
// and returns a DSN for database as it; the login is dropped when the test
// ends.
func mysqlUser(t *testing.T, admin *sql.DB, database string, grants ...string) (dsn, account string) {
	t.Helper()
	user, password := "idc_pf_"+randomHex(4), randomHex(8)
	account = "'" + user + "'@'%'"
	exec := func(stmt string) {
		t.Helper()
		if _, err := admin.ExecContext(context.Background(), stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	exec("CREATE USER " + account + " IDENTIFIED BY '" + password + "'")
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP USER IF EXISTS "+account) })
	for _, g := range grants {
		exec(strings.NewReplacer("<db>", "`"+database+"`", "<user>", account).Replace(g))
	}
	cfg, err := gomysql.ParseDSN(mysqltest.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd, cfg.DBName = user, password, database
	return cfg.FormatDSN(), account
}

// grantRE finds the GRANT statement a message tells to run.
var grantRE = regexp.MustCompile("run (GRANT [^;]*? TO '[^']+'@'[^']+')")

// The preflight against the real MariaDB, one case per reason: broken, then
// fixed by the statement the message suggests (or its equivalent). A
// privilege case runs as a least-privilege account, and its fix is the
// very GRANT the message names, run as root.
func TestEffectPreflightMySQL(t *testing.T) {
	upsert := config.Effect{Upsert: &config.Upsert{Table: "orders", Key: []string{"order_id"}, SequenceColumn: "version",
		Columns: map[string]string{"order_id": "$.orderId", "status": "$.status", "version": "$.version"}}}
	accounts := config.Effect{SQL: &config.SQL{Statement: "UPDATE accounts SET n = n + 1 WHERE id = :id", Params: map[string]string{"id": "$.id"}}}
	const orders = "CREATE TABLE <db>.orders (order_id VARCHAR(64) PRIMARY KEY, status TEXT, version BIGINT)"
	const accountsTable = "CREATE TABLE <db>.accounts (id VARCHAR(64) PRIMARY KEY, n INT NOT NULL DEFAULT 0)"
	for _, tc := range []struct {
		name     string
		effect   config.Effect
		setup    []string
		grants   []string // connect as a new account holding these
		reason   string
		contains []string
		fix      []string // "" runs the GRANT the message names
	}{
		{name: "table not found", effect: upsert, reason: messagingv1alpha1.ReasonTableNotFound,
			contains: []string{"`orders`", "CREATE TABLE", "PRIMARY KEY (`order_id`)"},
			fix:      []string{orders}},
		{name: "column not found", effect: upsert, setup: []string{"CREATE TABLE <db>.orders (order_id VARCHAR(64) PRIMARY KEY, version BIGINT)"},
			reason: messagingv1alpha1.ReasonColumnNotFound, contains: []string{"`status`", "ADD COLUMN", "spec.sink.effect.upsert.columns.status"},
			fix: []string{"ALTER TABLE <db>.orders ADD COLUMN status TEXT"}},
		{name: "required column not mapped", effect: upsert,
			setup:  []string{"CREATE TABLE <db>.orders (order_id VARCHAR(64) PRIMARY KEY, status TEXT, version BIGINT, region VARCHAR(8) NOT NULL)"},
			reason: messagingv1alpha1.ReasonColumnNotFound, contains: []string{"`region`", "NOT NULL"},
			fix: []string{"ALTER TABLE <db>.orders ALTER COLUMN region SET DEFAULT 'eu'"}},
		{name: "sequence column not an integer", effect: upsert, setup: []string{"CREATE TABLE <db>.orders (order_id VARCHAR(64) PRIMARY KEY, status TEXT, version VARCHAR(20))"},
			reason: messagingv1alpha1.ReasonColumnTypeMismatch, contains: []string{"`version`", "integer", "MODIFY COLUMN `version` BIGINT"},
			fix: []string{"ALTER TABLE <db>.orders MODIFY COLUMN version BIGINT"}},
		{name: "timestamp into a number", effect: config.Effect{Append: &config.Append{Table: "events", Columns: map[string]string{"at": "@publishedAt"}}},
			setup:  []string{"CREATE TABLE <db>.events (at INT)"},
			reason: messagingv1alpha1.ReasonColumnTypeMismatch, contains: []string{"`at`", "int", "@publishedAt"},
			fix: []string{"ALTER TABLE <db>.events MODIFY COLUMN at DATETIME(6)"}},
		{name: "no unique key", effect: upsert, setup: []string{"CREATE TABLE <db>.orders (order_id VARCHAR(64), status TEXT, version BIGINT)"},
			reason: messagingv1alpha1.ReasonNoUniqueKey, contains: []string{"`order_id`", "ADD UNIQUE KEY", "ON DUPLICATE KEY UPDATE"},
			fix: []string{"ALTER TABLE <db>.orders ADD UNIQUE KEY (order_id)"}},
		{name: "unique key over more than the upsert key", effect: upsert,
			setup:  []string{"CREATE TABLE <db>.orders (order_id VARCHAR(64), status VARCHAR(16), version BIGINT, UNIQUE KEY (order_id, status))"},
			reason: messagingv1alpha1.ReasonNoUniqueKey, contains: []string{"covers exactly the upsert key"},
			fix: []string{"ALTER TABLE <db>.orders ADD PRIMARY KEY (order_id)"}},
		{name: "privilege missing", effect: upsert, setup: []string{orders},
			grants: []string{"GRANT INSERT ON <db>.orders TO <user>"},
			reason: messagingv1alpha1.ReasonPermissionDenied, contains: []string{"`orders`", "GRANT SELECT, INSERT, UPDATE ON `"},
			fix: []string{""}},
		{name: "privilege missing, upsert without a sequence column", effect: config.Effect{Upsert: &config.Upsert{Table: "orders", Key: []string{"order_id"},
			Columns: map[string]string{"order_id": "$.orderId", "status": "$.status"}}}, setup: []string{orders},
			grants: []string{"GRANT INSERT ON <db>.orders TO <user>"},
			reason: messagingv1alpha1.ReasonPermissionDenied, contains: []string{"GRANT SELECT, INSERT, UPDATE ON `"},
			fix: []string{""}},
		{name: "no privilege on the table at all", effect: config.Effect{Append: &config.Append{Table: "events", Columns: map[string]string{"id": "$.id"}}},
			setup: []string{"CREATE TABLE <db>.events (id VARCHAR(64))", "CREATE TABLE <db>.other (id INT)"}, grants: []string{"GRANT SELECT ON <db>.other TO <user>"},
			reason: messagingv1alpha1.ReasonPermissionDenied, contains: []string{"`events`", "GRANT INSERT ON `"},
			fix: []string{""}},
		{name: "generated column mapped", effect: config.Effect{Append: &config.Append{Table: "events", Columns: map[string]string{"id": "$.id", "total": "$.total"}}},
			setup:  []string{"CREATE TABLE <db>.events (id VARCHAR(64), total INT AS (1) VIRTUAL)"},
			reason: messagingv1alpha1.ReasonStatementInvalid, contains: []string{"`total`", "generated"},
			fix: []string{"ALTER TABLE <db>.events DROP COLUMN total", "ALTER TABLE <db>.events ADD COLUMN total INT"}},
		{name: "statement with two commands", effect: config.Effect{SQL: &config.SQL{
			Statement: "UPDATE accounts SET n = n + 1 WHERE id = :id; DELETE FROM accounts", Params: map[string]string{"id": "$.id"}}},
			setup: []string{accountsTable}, reason: messagingv1alpha1.ReasonStatementInvalid, contains: []string{"MySQL error 1064", "one statement"}},
		{name: "statement on a missing table", effect: accounts, reason: messagingv1alpha1.ReasonTableNotFound,
			contains: []string{"accounts", "MySQL error 1146"}, fix: []string{accountsTable}},
		{name: "statement on a missing column", effect: config.Effect{SQL: &config.SQL{
			Statement: "UPDATE accounts SET total = total + :amount WHERE id = :id", Params: map[string]string{"id": "$.id", "amount": "$.amount"}}},
			setup: []string{accountsTable}, reason: messagingv1alpha1.ReasonColumnNotFound, contains: []string{"total", "MySQL error 1054"},
			fix: []string{"ALTER TABLE <db>.accounts ADD COLUMN total BIGINT NOT NULL DEFAULT 0"}},
		{name: "statement without the privilege", effect: accounts, setup: []string{accountsTable},
			grants: []string{"GRANT SELECT ON <db>.accounts TO <user>"},
			reason: messagingv1alpha1.ReasonPermissionDenied, contains: []string{"UPDATE command denied", "GRANT UPDATE ON `"},
			fix: []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			database, dsn := mysqltest.NewDatabase(t)
			admin := mysqlAdmin(t)
			run := func(stmts ...string) {
				t.Helper()
				for _, s := range stmts {
					if _, err := admin.ExecContext(context.Background(), strings.ReplaceAll(s, "<db>", "`"+database+"`")); err != nil {
						t.Fatalf("%s: %v", s, err)
					}
				}
			}
			run(tc.setup...)
			if tc.grants != nil {
				dsn, _ = mysqlUser(t, admin, database, tc.grants...)
			}
			cfg := &config.Config{Sink: config.Sink{Kind: config.SinkMySQL, Schema: database, InboxTable: "inbox", Layout: config.LayoutTable, Effect: tc.effect}}
			checker := New()
			t.Cleanup(checker.Pools().Close)
			target := Target{Owner: "test", DSN: dsn, Sink: cfg.Sink}
			err := checker.CheckEffect(context.Background(), target, cfg)
			var p *EffectProblem
			if !errors.As(err, &p) {
				t.Fatalf("Check = %v, want an EffectProblem with reason %s", err, tc.reason)
			}
			if p.Reason != tc.reason {
				t.Fatalf("reason %s (%s), want %s", p.Reason, p.Message, tc.reason)
			}
			t.Logf("%s: %s", p.Reason, p.Message)
			for _, s := range tc.contains {
				if !strings.Contains(p.Message, s) {
					t.Errorf("message %q does not contain %q", p.Message, s)
				}
			}
			if tc.fix == nil {
				return
			}
			for _, f := range tc.fix {
				if f == "" {
					m := grantRE.FindStringSubmatch(p.Message)
					if m == nil {
						t.Fatalf("message %q names no GRANT to run", p.Message)
					}
					f = m[1]
				}
				run(f)
			}
			if err := checker.CheckEffect(context.Background(), target, cfg); err != nil {
				t.Fatalf("after the fix %v: %v", tc.fix, err)
			}
			// Repeatable on the same pooled connections (the prepared
			// statements were closed).
			if err := checker.CheckEffect(context.Background(), target, cfg); err != nil {
				t.Fatalf("second check after the fix: %v", err)
			}
		})
	}
}

// Provisioning a MySQL inbox under an account without CREATE on the
// database fails with PermissionDenied naming the controller's GRANT;
// running that very statement fixes it. The identity row cannot be minted
// either: the database reads as unknown until a pool reads it again.
func TestInboxPrivilegeNamesTheGrantMySQL(t *testing.T) {
	database, _ := mysqltest.NewDatabase(t)
	admin := mysqlAdmin(t)
	dsn, account := mysqlUser(t, admin, database, "GRANT SELECT, INSERT, UPDATE, DELETE ON <db>.* TO <user>")
	c := New()
	t.Cleanup(c.Pools().Close)
	owner := inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "least", UID: "u1"}
	target := Target{Owner: "ns/least", DSN: dsn, Claim: inbox.OwnerClaim{Owner: owner},
		Sink: config.Sink{Kind: config.SinkMySQL, Schema: database, InboxTable: "inbox", Layout: config.LayoutTable}}
	_, err := c.Ensure(context.Background(), target)
	var p *EffectProblem
	if !errors.As(err, &p) || p.Reason != messagingv1alpha1.ReasonPermissionDenied {
		t.Fatalf("Ensure = %v, want a PermissionDenied problem", err)
	}
	want := "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX, LOCK TABLES ON `" + database + "`.* TO " + account
	if !strings.Contains(p.Message, want) {
		t.Fatalf("message %q does not name %q", p.Message, want)
	}
	if reason, msg := Classify(err, messagingv1alpha1.SecretKeyRef{Name: "db", Key: "dsn"}); reason != p.Reason || msg != p.Message {
		t.Errorf("Classify = %s %q, want the problem as it is", reason, msg)
	}
	if _, err := admin.ExecContext(context.Background(), grantRE.FindStringSubmatch(p.Message)[1]); err != nil {
		t.Fatal(err)
	}
	ens, err := c.Ensure(context.Background(), target)
	if err != nil || ens.Version != inbox.SchemaVersion || !ens.Migrated {
		t.Fatalf("after the GRANT: Ensure = %+v, %v", ens, err)
	}
	if ens.Identity.Database != "unknown/"+database {
		t.Fatalf("the pool that could not mint the identity names %q, want unknown/%s", ens.Identity.Database, database)
	}
	// A new pool (the manager restarted) mints and reads it.
	fresh := New()
	t.Cleanup(fresh.Pools().Close)
	target.Claim.Epoch = ens.Identity.Epoch
	again, err := fresh.Ensure(context.Background(), target)
	if err != nil || again.Migrated || !kinds[1].database.MatchString(again.Identity.Database) {
		t.Fatalf("Ensure on a new pool = %+v, %v", again, err)
	}
}
