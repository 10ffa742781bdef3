package sinkdb

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// The preflight against the real PostgreSQL, one case per reason: broken,
// then fixed by the statement the message suggests (or its equivalent).
// The envtest specs (controllers/phase_effect_envtest_test.go) show the
// same through the resource.
func TestEffectPreflight(t *testing.T) {
	upsert := config.Effect{Upsert: &config.Upsert{Table: "orders", Key: []string{"order_id"}, SequenceColumn: "version",
		Columns: map[string]string{"order_id": "$.orderId", "status": "$.status", "version": "$.version"}}}
	t.Cleanup(func() {
		// After every subtest's database is gone, the role owns nothing.
		conn, err := pgx.Connect(context.Background(), pgtest.AdminDSN())
		if err != nil {
			t.Errorf("dropping the test role: %v", err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP ROLE IF EXISTS idc_preflight_role"); err != nil {
			t.Errorf("dropping the test role: %v", err)
		}
	})
	for _, tc := range []struct {
		name     string
		effect   config.Effect
		setup    []string
		role     bool // connect as a role that owns nothing
		reason   string
		contains []string
		fix      []string
	}{
		{name: "table not found", effect: upsert, reason: messagingv1alpha1.ReasonTableNotFound,
			contains: []string{`"app"."orders"`, "CREATE TABLE"},
			fix:      []string{"CREATE TABLE app.orders (order_id text PRIMARY KEY, status text, version bigint)"}},
		{name: "column not found", effect: upsert, setup: []string{"CREATE TABLE app.orders (order_id text PRIMARY KEY, version bigint)"},
			reason: messagingv1alpha1.ReasonColumnNotFound, contains: []string{`"status"`, "ADD COLUMN", "spec.sink.effect.upsert.columns.status"},
			fix: []string{"ALTER TABLE app.orders ADD COLUMN status text"}},
		{name: "required column not mapped", effect: upsert,
			setup:  []string{"CREATE TABLE app.orders (order_id text PRIMARY KEY, status text, version bigint, region text NOT NULL)"},
			reason: messagingv1alpha1.ReasonColumnNotFound, contains: []string{`"region"`, "NOT NULL"},
			fix: []string{"ALTER TABLE app.orders ALTER COLUMN region SET DEFAULT 'eu'"}},
		{name: "sequence column not an integer", effect: upsert, setup: []string{"CREATE TABLE app.orders (order_id text PRIMARY KEY, status text, version text)"},
			reason: messagingv1alpha1.ReasonColumnTypeMismatch, contains: []string{`"version"`, "integer", "TYPE bigint"},
			fix: []string{"ALTER TABLE app.orders ALTER COLUMN version TYPE bigint USING version::bigint"}},
		{name: "timestamp into a number", effect: config.Effect{Append: &config.Append{Table: "events", Columns: map[string]string{"at": "@publishedAt"}}},
			setup:  []string{"CREATE TABLE app.events (at int)"},
			reason: messagingv1alpha1.ReasonColumnTypeMismatch, contains: []string{`"at"`, "integer", "@publishedAt"},
			fix: []string{"ALTER TABLE app.events ALTER COLUMN at TYPE timestamptz USING now()"}},
		{name: "no unique key", effect: upsert, setup: []string{"CREATE TABLE app.orders (order_id text, status text, version bigint)"},
			reason: messagingv1alpha1.ReasonNoUniqueKey, contains: []string{`"order_id"`, "CREATE UNIQUE INDEX"},
			fix: []string{"CREATE UNIQUE INDEX ON app.orders (order_id)"}},
		{name: "permission denied", effect: upsert, role: true,
			setup:  []string{"CREATE TABLE app.orders (order_id text PRIMARY KEY, status text, version bigint)", "GRANT USAGE ON SCHEMA app TO idc_preflight_role", "GRANT INSERT ON app.orders TO idc_preflight_role"},
			reason: messagingv1alpha1.ReasonPermissionDenied, contains: []string{"UPDATE", `"app"."orders"`, "GRANT SELECT, INSERT, UPDATE"},
			fix: []string{"GRANT SELECT, UPDATE ON app.orders TO idc_preflight_role"}},
		{name: "generated column mapped", effect: config.Effect{Append: &config.Append{Table: "events", Columns: map[string]string{"id": "$.id", "total": "$.total"}}},
			setup:  []string{"CREATE TABLE app.events (id text, total int GENERATED ALWAYS AS (1) STORED)"},
			reason: messagingv1alpha1.ReasonStatementInvalid, contains: []string{"total", "cannot run"},
			fix: []string{"ALTER TABLE app.events ALTER COLUMN total DROP EXPRESSION"}},
		{name: "statement with two commands", effect: config.Effect{SQL: &config.SQL{
			Statement: "UPDATE app.accounts SET n = n + 1 WHERE id = :id; DELETE FROM app.accounts",
			Params:    map[string]string{"id": "$.id"}}},
			setup:  []string{"CREATE TABLE app.accounts (id text PRIMARY KEY, n int NOT NULL DEFAULT 0)"},
			reason: messagingv1alpha1.ReasonStatementInvalid, contains: []string{"multiple commands", "one command"}},
		{name: "statement on a missing table", effect: config.Effect{SQL: &config.SQL{
			Statement: "UPDATE app.accounts SET n = n + 1 WHERE id = :id", Params: map[string]string{"id": "$.id"}}},
			reason: messagingv1alpha1.ReasonTableNotFound, contains: []string{"accounts", "42P01"},
			fix: []string{"CREATE TABLE app.accounts (id text PRIMARY KEY, n int NOT NULL DEFAULT 0)"}},
		{name: "statement without the privilege", effect: config.Effect{SQL: &config.SQL{
			Statement: "UPDATE app.accounts SET n = n + 1 WHERE id = :id", Params: map[string]string{"id": "$.id"}}},
			role:   true,
			setup:  []string{"CREATE TABLE app.accounts (id text PRIMARY KEY, n int NOT NULL DEFAULT 0)", "GRANT USAGE ON SCHEMA app TO idc_preflight_role"},
			reason: messagingv1alpha1.ReasonPermissionDenied, contains: []string{"permission denied", "GRANT"},
			fix: []string{"GRANT SELECT, UPDATE ON app.accounts TO idc_preflight_role"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, dsn := pgtest.NewPool(t)
			pgtest.Exec(t, pool, "CREATE SCHEMA app")
			if tc.role {
				pgtest.Exec(t, pool, "DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idc_preflight_role') THEN CREATE ROLE idc_preflight_role LOGIN; END IF; END$$")
				dsn = strings.Replace(dsn, "postgres://postgres@", "postgres://idc_preflight_role@", 1)
				t.Cleanup(func() { pgtest.Exec(t, pool, "DROP OWNED BY idc_preflight_role") })
			}
			pgtest.Exec(t, pool, tc.setup...)
			cfg := &config.Config{Sink: config.Sink{Schema: "app", InboxTable: "inbox", Effect: tc.effect}}
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
			for _, s := range tc.contains {
				if !strings.Contains(p.Message, s) {
					t.Errorf("message %q does not contain %q", p.Message, s)
				}
			}
			if tc.fix == nil {
				return
			}
			pgtest.Exec(t, pool, tc.fix...)
			if err := checker.CheckEffect(context.Background(), target, cfg); err != nil {
				t.Fatalf("after the fix: %v", err)
			}
			// The check is repeatable on the same pooled connections (the
			// prepared statement was deallocated).
			if err := checker.CheckEffect(context.Background(), target, cfg); err != nil {
				t.Fatalf("second check after the fix: %v", err)
			}
		})
	}
}
