package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// leastPrivilege runs the real binary under the role a DBA grants: USAGE and
// CREATE on an existing schema, SELECT, INSERT and UPDATE on the effect
// table, and nothing on the database (no CREATE there, no superuser, not the
// owner of anything it did not create). It must migrate, start and apply 500
// messages exactly once, for both inbox layouts (Partitioned creates day
// partitions while it runs) and with the outbox (spec.emit) relaying.
func leastPrivilege(t *testing.T, bin string) {
	for _, layout := range []config.Layout{config.LayoutTable, config.LayoutPartitioned} {
		t.Run(string(layout), func(t *testing.T) {
			const total = 500
			b := newJetStream(t, 30*time.Second)
			out := newJetStream(t, 30*time.Second)
			db := newDatabase(t)
			// No sequence behind the effect table: a serial column would
			// need USAGE on its sequence too (README, least privilege).
			db.exec(t, "CREATE SCHEMA app", "CREATE TABLE app.effects (message_id text NOT NULL, n int NOT NULL)")
			role := leastPrivilegeRole(t, db, "app", "app.effects")
			env := "IDC_INTEGRATION_ROLE_DSN_" + strings.ToUpper(db.name[len(db.name)-6:])
			t.Setenv(env, role)
			cfg := appendConfig(b.sourceConfig(), env)
			cfg.Sink.Layout = layout
			cfg.Emit = &config.Emit{NATSJetStream: &config.EmitJetStream{URL: natsURL, Subject: out.subject + ".applied"},
				When: config.EmitAlways, Payload: map[string]string{"id": "@messageId", "n": "$.n"}}
			var msgs []outgoing
			for _, e := range plainEvents(total) {
				msgs = append(msgs, e.outgoing())
			}
			b.publish(t, msgs)

			p := startBinary(t, bin, cfg)
			p.waitStatus(t, "/readyz", http.StatusOK, 60*time.Second)
			waitFor(t, 60*time.Second, "every message applied and relayed", func() error {
				applied := db.queryInt(t, "SELECT count(*) FROM app.effects")
				sent := db.queryInt(t, "SELECT count(*) FROM app.inbox_orders_outbox WHERE sent_at IS NOT NULL")
				if applied < total || sent < total {
					return fmt.Errorf("%d of %d applied, %d relayed", applied, total, sent)
				}
				return nil
			})
			waitFor(t, 30*time.Second, "every message acknowledged", func() error { return b.drained(context.Background()) })
			expectCleanExit(t, p, p.terminate(t))
			checkExactlyOnce(t, db, b, total)
			if strings.Contains(p.logs.String(), "Startup step failed") {
				t.Errorf("a startup step failed under the least-privilege role:\n%s", p.logs.String())
			}
			// Everything the runtime made, it made as the role: nothing
			// fell back to a privileged path.
			if n := db.queryInt(t, `SELECT count(*) FROM pg_tables WHERE schemaname = 'app' AND tablename LIKE 'inbox_orders%' AND tableowner = $1`,
				roleName(t, role)); n == 0 {
				t.Error("the role owns no inbox table")
			}
		})
	}
}

// leastPrivilegeRole creates a login role with USAGE and CREATE on schema
// and SELECT, INSERT, UPDATE on table, revokes the database-wide defaults
// that PUBLIC has (CREATE and TEMP on the database, CREATE on public), and
// returns a DSN for it. The role is dropped when the test ends.
func leastPrivilegeRole(t *testing.T, db *database, schema, table string) string {
	t.Helper()
	role := "idc_least_" + strings.ToLower(db.name[len(db.name)-6:])
	dbIdent := pgx.Identifier{db.name}.Sanitize()
	db.exec(t,
		"CREATE ROLE "+role+" LOGIN",
		"REVOKE ALL ON DATABASE "+dbIdent+" FROM PUBLIC",
		"GRANT CONNECT ON DATABASE "+dbIdent+" TO "+role,
		"REVOKE ALL ON SCHEMA public FROM PUBLIC",
		"GRANT USAGE, CREATE ON SCHEMA "+schema+" TO "+role,
		"GRANT SELECT, INSERT, UPDATE ON "+table+" TO "+role)
	t.Cleanup(func() {
		ctx := context.Background()
		for _, s := range []string{"DROP OWNED BY " + role, "DROP ROLE IF EXISTS " + role} {
			if _, err := db.pool.Exec(ctx, s); err != nil {
				t.Errorf("cleaning up role %s (%s): %v", role, s, err)
			}
		}
	})
	if n := db.queryInt(t, "SELECT count(*) FROM pg_roles WHERE rolname = $1 AND (rolsuper OR rolcreatedb OR rolcreaterole)", role); n != 0 {
		t.Fatalf("role %s has more than the grants above", role)
	}
	var canCreate bool
	if err := db.pool.QueryRow(context.Background(), "SELECT has_database_privilege($1, current_database(), 'CREATE')", role).Scan(&canCreate); err != nil || canCreate {
		t.Fatalf("role %s can CREATE on the database (%v): the test would prove nothing", role, err)
	}
	u, err := url.Parse(db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}

func roleName(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.User
}
