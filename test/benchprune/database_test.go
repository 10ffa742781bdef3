package benchprune

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

func adminDSN() string {
	if v := os.Getenv(adminDSNEnv); v != "" {
		return v
	}
	return defaultAdminDSN
}

// newDatabase creates an empty database for the run and drops it (sessions
// forced out) when the benchmark or test ends, failed or not.
func newDatabase(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminDSN())
	if err != nil {
		tb.Fatalf("PostgreSQL is required for this benchmark and is unreachable: %v", err)
	}
	defer admin.Close(context.Background())
	suffix := make([]byte, 6)
	if _, err := rand.Read(suffix); err != nil {
		tb.Fatal(err)
	}
	name := "idc_bench_prune_" + hex.EncodeToString(suffix)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("while creating database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := pgx.Connect(ctx, adminDSN())
		if err != nil {
			tb.Errorf("while connecting to drop %s: %v", name, err)
			return
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Errorf("while dropping database %s: %v", name, err)
		}
	})
	cfg, err := pgx.ParseConfig(adminDSN())
	if err != nil {
		tb.Fatal(err)
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable&application_name=%s", cfg.User, cfg.Host, cfg.Port, name, name)
}

func newPool(tb testing.TB, dsn string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func exec(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, stmts ...string) {
	tb.Helper()
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			tb.Fatalf("while running %q: %v", s, err)
		}
	}
}
