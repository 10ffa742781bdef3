package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
	"github.com/idempotency-dev/idc-operator/runtime/sink/sinktest"
)

func pool(db sink.DB) postgres.DB { return db.(postgres.DB) }

// TestConformance runs the sink conformance suite on the real PostgreSQL.
func TestConformance(t *testing.T) {
	sinktest.Run(t, sinktest.Harness{
		Open: func(t *testing.T) (sink.DB, string) {
			p, _ := pgtest.NewPool(t)
			pgtest.Exec(t, p, "CREATE SCHEMA conformance")
			return postgres.New(p), "conformance"
		},
		CreateOrders: func(t *testing.T, db sink.DB, schema, table string) {
			q := pgx.Identifier{schema, table}.Sanitize()
			pgtest.Exec(t, pool(db).Pool,
				"CREATE TABLE "+q+" (order_id text PRIMARY KEY, status text, version bigint)",
				"CREATE TABLE "+pgx.Identifier{schema, table + "_events"}.Sanitize()+" (event_id text, order_id text)")
		},
		Orders: func(t *testing.T, db sink.DB, schema, table string) map[string]sinktest.Order {
			rows, err := pool(db).Pool.Query(context.Background(), "SELECT order_id, status, coalesce(version, -1) FROM "+pgx.Identifier{schema, table}.Sanitize())
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]sinktest.Order{}
			var id string
			var o sinktest.Order
			if _, err := pgx.ForEachRow(rows, []any{&id, &o.Status, &o.Version}, func() error { out[id] = o; return nil }); err != nil {
				t.Fatal(err)
			}
			return out
		},
		Count: func(t *testing.T, db sink.DB, schema, table string) int {
			var n int
			if err := pool(db).Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{schema, table}.Sanitize()).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
		Age: func(t *testing.T, db sink.DB, schema, table string, ids []string, d time.Duration) {
			if _, err := pool(db).Pool.Exec(context.Background(), "UPDATE "+pgx.Identifier{schema, table}.Sanitize()+
				" SET processed_at = processed_at - $2::bigint * interval '1 microsecond' WHERE message_id = ANY($1)", ids, d.Microseconds()); err != nil {
				t.Fatal(err)
			}
		},
		OpenAs: openAs,
		Advice: func(_ sink.DB, err error) string {
			var pe *postgres.PrivilegeError
			if errors.As(err, &pe) {
				return pe.Grant
			}
			return ""
		},
	})
}

// openAs creates a login role holding exactly postgres.RuntimeGrants with
// the inbox's options opts (less without) and opens the database as it;
// the role and what it owns are dropped when the test ends.
func openAs(t *testing.T, db sink.DB, schema string, n inbox.Names, layout config.Layout, without sinktest.Revoke, opts ...inbox.Option) sink.DB {
	t.Helper()
	admin := pool(db).Pool
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role := "idc_rt_" + hex.EncodeToString(b)
	pgtest.Exec(t, admin, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() {
		c := context.Background()
		_, _ = admin.Exec(c, "DROP OWNED BY "+role)
		_, _ = admin.Exec(c, "DROP ROLE IF EXISTS "+role)
	})
	pgtest.Exec(t, admin, postgres.RuntimeGrants(n, layout, role, opts...)...)
	if without.Privilege != "" {
		pgtest.Exec(t, admin, "REVOKE "+without.Privilege+" ON "+pgx.Identifier{schema, without.Table}.Sanitize()+" FROM "+role)
	}
	cfg := admin.Config().Copy()
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, ""
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return postgres.New(p)
}
