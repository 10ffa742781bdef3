package postgres_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
)

func TestAdvice(t *testing.T) {
	for _, c := range []struct{ code, msg, want string }{
		{"42501", "permission denied for table orders_inbox", `GRANT SELECT, INSERT ON "app"."orders_inbox" TO "rt"`},
		{"42501", "permission denied for schema app", `GRANT USAGE ON SCHEMA "app" TO "rt"`},
		{"42501", "permission denied for sequence orders_inbox_dead_letters_id_seq", `GRANT USAGE ON SEQUENCE "app"."orders_inbox_dead_letters_id_seq" TO "rt"`},
		{"42501", "must be owner of table orders_inbox", ""},
		{"42P01", `relation "app.orders_inbox" does not exist`, ""},
	} {
		err := fmt.Errorf("while claiming: %w", &pgconn.PgError{Code: c.code, Message: c.msg})
		if got := postgres.Advice(err, "app", "SELECT, INSERT", "rt"); got != c.want {
			t.Errorf("Advice(%s %q) = %q, want %q", c.code, c.msg, got, c.want)
		}
	}
}
