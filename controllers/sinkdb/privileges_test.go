package sinkdb

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// Provisioning the inbox under a role that lacks a grant fails with
// PermissionDenied and a message naming the one grant to run; running it
// fixes the case. The role never has CREATE on the database unless a case
// says so: USAGE and CREATE on the schema are all the inbox needs.
func TestInboxPrivilegeNamesTheGrant(t *testing.T) {
	const role = "idc_inbox_grant_role"
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), pgtest.AdminDSN())
		if err != nil {
			t.Errorf("dropping the test role: %v", err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("dropping the test role: %v", err)
		}
	})
	for _, tc := range []struct {
		name     string
		setup    []string
		contains []string
		fix      []string
	}{
		{name: "no schema and no CREATE on the database",
			contains: []string{`lacks CREATE on database`, `CREATE SCHEMA "app" AUTHORIZATION "` + role + `"`},
			fix:      []string{"CREATE SCHEMA app AUTHORIZATION " + role}},
		{name: "schema without USAGE", setup: []string{"CREATE SCHEMA app"},
			contains: []string{`lacks USAGE on schema "app"`, `GRANT USAGE, CREATE ON SCHEMA "app" TO "` + role + `"`},
			fix:      []string{"GRANT USAGE, CREATE ON SCHEMA app TO " + role}},
		{name: "schema with USAGE only", setup: []string{"CREATE SCHEMA app", "GRANT USAGE ON SCHEMA app TO " + role},
			contains: []string{`lacks CREATE on schema "app"`, `GRANT CREATE ON SCHEMA "app" TO "` + role + `"`},
			fix:      []string{"GRANT CREATE ON SCHEMA app TO " + role}},
		{name: "an inbox table another role owns", setup: []string{"CREATE SCHEMA app", "GRANT USAGE, CREATE ON SCHEMA app TO " + role,
			"CREATE TABLE app.inbox (message_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())"},
			contains: []string{`must be owner of table inbox`, `OWNER TO "` + role + `"`},
			fix:      []string{"ALTER TABLE app.inbox OWNER TO " + role}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, dsn := pgtest.NewPool(t)
			name := dbName(t, dsn)
			pgtest.Exec(t, pool, "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '"+role+"') THEN CREATE ROLE "+role+" LOGIN; END IF; END $$",
				"REVOKE ALL ON DATABASE "+pgx.Identifier{name}.Sanitize()+" FROM PUBLIC",
				"GRANT CONNECT ON DATABASE "+pgx.Identifier{name}.Sanitize()+" TO "+role,
				"REVOKE ALL ON SCHEMA public FROM PUBLIC")
			pgtest.Exec(t, pool, tc.setup...)
			t.Cleanup(func() { pgtest.Exec(t, pool, "DROP OWNED BY "+role) })
			client := New()
			t.Cleanup(client.Pools().Close)
			target := Target{Owner: "test", DSN: asRole(t, dsn, role), Sink: config.Sink{Schema: "app", InboxTable: "inbox", Layout: config.LayoutTable}}
			_, err := client.Ensure(context.Background(), target)
			var p *EffectProblem
			if !errors.As(err, &p) || p.Reason != messagingv1alpha1.ReasonPermissionDenied {
				t.Fatalf("Ensure = %v, want a PermissionDenied problem", err)
			}
			reason, msg := Classify(err, messagingv1alpha1.SecretKeyRef{Name: "db", Key: "dsn"})
			if reason != p.Reason || msg != p.Message {
				t.Errorf("Classify = %s %q, want the problem as it is", reason, msg)
			}
			for _, s := range tc.contains {
				if !strings.Contains(p.Message, s) {
					t.Errorf("message %q does not contain %q", p.Message, s)
				}
			}
			pgtest.Exec(t, pool, tc.fix...)
			if v, err := client.Ensure(context.Background(), target); err != nil || v.Version == 0 {
				t.Fatalf("after %v: Ensure = %d, %v", tc.fix, v.Version, err)
			}
		})
	}
}

func dbName(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Database
}

func asRole(t *testing.T, dsn, role string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return u.String()
}
