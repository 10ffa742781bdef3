package postgres_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
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

// TestRuntimeGrants: the optional tables are granted only to an inbox that
// uses them, with what their operations need.
func TestRuntimeGrants(t *testing.T) {
	n := inbox.NamesFor(config.Sink{Schema: "app", InboxTable: "orders_inbox"})
	plain := strings.Join(postgres.RuntimeGrants(n, config.LayoutTable, "rt"), "\n")
	if strings.Contains(plain, "_outbox") || strings.Contains(plain, "_redrives") {
		t.Errorf("grants without options name an optional table:\n%s", plain)
	}
	all := postgres.RuntimeGrants(n, config.LayoutTable, "rt", inbox.WithOutbox(true), inbox.WithRedrives())
	for _, want := range []string{
		`GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."orders_inbox_outbox" TO "rt"`,
		`GRANT SELECT, INSERT ON "app"."orders_inbox_redrives" TO "rt"`,
	} {
		if !slices.Contains(all, want) {
			t.Errorf("grants with the outbox and the redrives log lack %s:\n%s", want, strings.Join(all, "\n"))
		}
	}
	// The sequences' grant comes after the tables' (it covers the
	// sequences that exist when it runs).
	if last := all[len(all)-1]; !strings.HasPrefix(last, "GRANT USAGE ON ALL SEQUENCES IN SCHEMA") {
		t.Errorf("the last grant is %q, want the sequences'", last)
	}
}
