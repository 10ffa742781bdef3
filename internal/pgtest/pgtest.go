// Package pgtest gives each test its own PostgreSQL database on the real
// server, so tests never share state and never touch other databases.
package pgtest

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

// AdminDSNEnv overrides the maintenance connection (default: the loopback
// server as user postgres, database postgres).
const AdminDSNEnv = "IDC_TEST_PG_DSN"

const defaultAdminDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// DatabasePrefix starts the name of every database these helpers create.
const DatabasePrefix = "idc_pipeline_test"

// Create creates an empty database named prefix_<random> and returns its
// name and a DSN without application_name (so a program under test sets its
// own). The database is dropped (connections forced out) when the test ends.
// A server that cannot be reached fails the test: these tests never skip.
func Create(t testing.TB, prefix string) (name, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, AdminDSN())
	if err != nil {
		t.Fatalf("pgtest: PostgreSQL is required for this test and is unreachable: %v", err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	name = prefix + "_" + randomSuffix(t)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: while creating database %s: %v", name, err)
	}
	t.Cleanup(func() { dropDatabase(t, name) })
	cfg, err := pgx.ParseConfig(AdminDSN())
	if err != nil {
		t.Fatalf("pgtest: while parsing the admin DSN: %v", err)
	}
	return name, fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
}

// NewDatabase creates a uniquely named empty database and returns its DSN,
// tagged with application_name = the database name.
func NewDatabase(t testing.TB) string {
	t.Helper()
	name, dsn := Create(t, DatabasePrefix)
	return dsn + "&application_name=" + name
}

// NewPool creates a database and a pool on it, closed at the end of the test.
func NewPool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatalf("pgtest: while opening a pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, dsn
}

// Exec runs statements on the pool and fails the test on error.
func Exec(t testing.TB, pool *pgxpool.Pool, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("pgtest: while running %q: %v", s, err)
		}
	}
}

// AdminDSN is the maintenance connection: IDC_TEST_PG_DSN, else the
// loopback server as user postgres, database postgres.
func AdminDSN() string {
	if v := os.Getenv(AdminDSNEnv); v != "" {
		return v
	}
	return defaultAdminDSN
}

func randomSuffix(t testing.TB) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("pgtest: while generating a database name: %v", err)
	}
	return hex.EncodeToString(b)
}

func dropDatabase(t testing.TB, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, AdminDSN())
	if err != nil {
		t.Errorf("pgtest: while connecting to drop %s: %v", name, err)
		return
	}
	defer func() { _ = admin.Close(context.Background()) }()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Errorf("pgtest: while dropping database %s: %v", name, err)
	}
}
