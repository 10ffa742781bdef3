package integration

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
)

// database is a PostgreSQL database private to one test, dropped (with its
// connections forced out) when the test ends.
type database struct {
	name string
	dsn  string
	pool *pgxpool.Pool // for the test's own checks
}

func newDatabase(t *testing.T) *database {
	t.Helper()
	name, dsn := pgtest.Create(t, "idc_integration_test")
	db := &database{name: name, dsn: dsn}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db.pool = pool
	return db
}

func (db *database) newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), db.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (db *database) exec(t *testing.T, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := db.pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("running %q: %v", s, err)
		}
	}
}

func (db *database) queryInt(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("running %q: %v", sql, err)
	}
	return n
}

// terminateBackends kills every other connection to the database, as an
// operator's pg_terminate_backend or a failover would. It returns how many
// backends it terminated.
func (db *database) terminateBackends(ctx context.Context, admin *pgx.Conn) (int, error) {
	var n int
	err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db.name).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("while terminating backends: %w", err)
	}
	return n, nil
}
