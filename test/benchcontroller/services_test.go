package benchcontroller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	defaultAdminDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	defaultNATSURL  = "nats://127.0.0.1:4222"
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func adminDSN() string { return envOr("IDC_TEST_PG_DSN", defaultAdminDSN) }
func natsURL() string  { return envOr("IDC_TEST_NATS_URL", defaultNATSURL) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newDatabase creates a database for the run, dropped (its connections
// forced out) at cleanup, and returns the DSN the Secret carries.
func newDatabase(b *testing.B) string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminDSN())
	if err != nil {
		b.Fatalf("PostgreSQL is required on 127.0.0.1:5432 (make services): %v", err)
	}
	defer admin.Close(context.Background())
	name := "idc_bench_ctrl_" + randomHex(6)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		b.Fatalf("while creating database %s: %v", name, err)
	}
	b.Cleanup(func() { dropDatabase(b, name) })
	cfg := admin.Config()
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
}

func dropDatabase(b *testing.B, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminDSN())
	if err != nil {
		b.Errorf("while connecting to drop database %s: %v", name, err)
		return
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		b.Errorf("while dropping database %s: %v", name, err)
	}
}

// createEffectTables creates each resource's upsert table, as the
// service's migration would before its consumer is deployed (the
// controller's EffectReady preflight holds the runtime at 0 replicas
// without it).
func (s settings) createEffectTables(b *testing.B, dsn string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatalf("while connecting to create the effect tables: %v", err)
	}
	defer conn.Close(context.Background())
	stmts := []string{"CREATE SCHEMA " + pgx.Identifier{inboxSchema}.Sanitize()}
	for i := range s.resources {
		table := pgx.Identifier{inboxSchema, "orders_" + strings.ReplaceAll(resourceName(i), "-", "_")}.Sanitize()
		stmts = append(stmts, "CREATE TABLE "+table+" (order_id text PRIMARY KEY, status text, version bigint)")
	}
	for _, stmt := range stmts {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			b.Fatalf("while running %q: %v", stmt, err)
		}
	}
}

// countTables counts the tables the controller provisioned in schema.
func countTables(ctx context.Context, dsn, schema string) (int, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", schema).Scan(&n)
	return n, err
}

// newStream creates a limits-retention stream whose MaxAge bounds replay, so
// Derived retention resolves; it is deleted at cleanup.
func newStream(b *testing.B, maxAge time.Duration) (stream, subjectPrefix string) {
	b.Helper()
	nc, err := nats.Connect(natsURL(), nats.Timeout(5*time.Second))
	if err != nil {
		b.Fatalf("NATS with JetStream is required on 127.0.0.1:4222 (make services): %v", err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatalf("while opening JetStream: %v", err)
	}
	suffix := randomHex(4)
	stream = "BENCH_CTRL_" + strings.ToUpper(suffix)
	subjectPrefix = "bench_ctrl_" + suffix
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{subjectPrefix + ".>"}, MaxAge: maxAge, Retention: jetstream.LimitsPolicy,
	}); err != nil {
		b.Fatalf("while creating stream %s: %v", stream, err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil {
			b.Errorf("while deleting stream %s: %v", stream, err)
		}
	})
	return stream, subjectPrefix
}
