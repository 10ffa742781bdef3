package inbox

import (
	"context"
	"errors"
	"testing"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// deletionPolicy: Delete drops only tables the inbox's own meta table marks
// as the operator's: a user's table that has the inbox's name, or a meta
// table of another shape or content, is refused and left as it is; an inbox
// Migrate made is dropped, and dropping it again succeeds.
func TestDropRefusesTablesNotMarkedAsTheOperators(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		setup []string
	}{
		{name: "a user's table with the inbox's name, no meta table",
			setup: []string{"CREATE TABLE app.inbox_orders (id int PRIMARY KEY, note text)", "INSERT INTO app.inbox_orders VALUES (1, 'keep me')"}},
		{name: "a meta table of another shape",
			setup: []string{"CREATE TABLE app.inbox_orders (id int PRIMARY KEY, note text)", "INSERT INTO app.inbox_orders VALUES (1, 'keep me')",
				"CREATE TABLE app.inbox_orders_meta (k text, v text)"}},
		{name: "the meta table's shape without its row",
			setup: []string{"CREATE TABLE app.inbox_orders (id int PRIMARY KEY, note text)", "INSERT INTO app.inbox_orders VALUES (1, 'keep me')",
				"CREATE TABLE app.inbox_orders_meta (singleton boolean PRIMARY KEY DEFAULT true, schema_version int NOT NULL, layout text NOT NULL, migrated_at timestamptz NOT NULL DEFAULT now())"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, _ := pgtest.NewPool(t)
			pgtest.Exec(t, pool, append([]string{"CREATE SCHEMA app"}, tc.setup...)...)
			s, err := New(pool, config.Sink{Schema: "app", InboxTable: "inbox_orders", Layout: config.LayoutTable})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Drop(ctx); !errors.Is(err, ErrNotOperatorInbox) {
				t.Fatalf("Drop = %v, want ErrNotOperatorInbox", err)
			}
			var note string
			if err := pool.QueryRow(ctx, "SELECT note FROM app.inbox_orders WHERE id = 1").Scan(&note); err != nil || note != "keep me" {
				t.Fatalf("the user's table after a refused Drop: %q, %v", note, err)
			}
		})
	}
	t.Run("an inbox Migrate made", func(t *testing.T) {
		pool, _ := pgtest.NewPool(t)
		pgtest.Exec(t, pool, "CREATE SCHEMA app", "CREATE TABLE app.orders (id int)")
		s, err := New(pool, config.Sink{Schema: "app", InboxTable: "inbox_orders", Layout: config.LayoutPartitioned}, WithOutbox(true))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Drop(ctx); err != nil {
			t.Fatalf("Drop of the operator's own inbox: %v", err)
		}
		var left int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'app' AND tablename LIKE 'inbox_orders%'").Scan(&left); err != nil || left != 0 {
			t.Fatalf("%d inbox tables left (%v)", left, err)
		}
		if err := s.Drop(ctx); err != nil {
			t.Fatalf("Drop of what is gone: %v", err)
		}
		var user int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'app' AND tablename = 'orders'").Scan(&user); err != nil || user != 1 {
			t.Fatalf("the user's own table in the schema went too (%d, %v)", user, err)
		}
	})
}
