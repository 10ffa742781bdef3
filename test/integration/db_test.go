package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// adminDSNEnv overrides the maintenance connection, as in runtime/internal/pgtest
// (which this package, outside runtime/, cannot import).
const adminDSNEnv = "IDC_TEST_PG_DSN"

const defaultAdminDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

func adminDSN() string {
	if v := os.Getenv(adminDSNEnv); v != "" {
		return v
	}
	return defaultAdminDSN
}

// database is a PostgreSQL database private to one test, dropped (with its
// connections forced out) when the test ends.
type database struct {
	name string
	dsn  string
	pool *pgxpool.Pool // for the test's own checks
}

func newDatabase(t *testing.T) *database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminDSN())
	if err != nil {
		t.Fatalf("PostgreSQL is required for this test and is unreachable: %v", err)
	}
	defer admin.Close(context.Background())
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idc_integration_test_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	t.Cleanup(func() { dropDatabase(t, name) })
	cfg, err := pgx.ParseConfig(adminDSN())
	if err != nil {
		t.Fatal(err)
	}
	db := &database{name: name, dsn: fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)}
	db.pool = db.newPool(t)
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

func dropDatabase(t *testing.T, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminDSN())
	if err != nil {
		t.Errorf("connecting to drop %s: %v", name, err)
		return
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Errorf("dropping database %s: %v", name, err)
	}
}
