package localcluster

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSURL is the NATS JetStream server the host side talks to: the
// machine's (127.0.0.1:4222) unless UseNATS named another.
var NATSURL = "nats://127.0.0.1:4222"

// PodNATSURL is the same server as pods see it: for the machine's, the
// node's socat forward on the bridge gateway.
var PodNATSURL = "nats://" + BridgeIP + ":4222"

// UseNATS points NATSURL and PodNATSURL at a server that listens on the
// bridge gateway, where the host and the pods both reach it (the e2e
// suite's nats-server 2.15.3). Call it before any step runs.
func UseNATS(url string) {
	NATSURL, PodNATSURL = url, url
}

// PodDSN rewrites a host DSN on 127.0.0.1 to the bridge gateway, where the
// node forwards PostgreSQL to pods.
func PodDSN(dsn string) string {
	return strings.Replace(dsn, "@127.0.0.1:", "@"+BridgeIP+":", 1)
}

// adminDSNEnv overrides the maintenance connection, as in the other suites.
const adminDSNEnv = "IDC_TEST_PG_DSN"

// AdminDSN is the maintenance connection to the local PostgreSQL (user
// postgres, trust authentication), or $IDC_TEST_PG_DSN.
func AdminDSN() string {
	if v := os.Getenv(adminDSNEnv); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// DatabaseDSN is the DSN of another database on the same server.
func DatabaseDSN(name string) (string, error) {
	u, err := url.Parse(AdminDSN())
	if err != nil {
		return "", fmt.Errorf("parsing the admin DSN: %w", err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// CheckServices fails, saying what to start, when PostgreSQL or NATS with
// JetStream is not reachable.
func CheckServices(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, AdminDSN())
	if err != nil {
		return fmt.Errorf("PostgreSQL is not reachable on 127.0.0.1:5432 (start it with: make services): %w", err)
	}
	_ = conn.Close(ctx)
	nc, err := nats.Connect(NATSURL, nats.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("NATS is not reachable on %s (the machine's 127.0.0.1:4222 starts with: make services): %w", NATSURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("opening JetStream: %w", err)
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("NATS on %s has no JetStream (run nats-server with -js; make services does): %w", NATSURL, err)
	}
	return nil
}

// RecreateDatabase drops the database (forcing its connections out) and
// creates it empty; it returns its DSN.
func RecreateDatabase(ctx context.Context, name string) (string, error) {
	if err := DropDatabase(ctx, name); err != nil {
		return "", err
	}
	admin, err := pgx.Connect(ctx, AdminDSN())
	if err != nil {
		return "", fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("creating database %s: %w", name, err)
	}
	return DatabaseDSN(name)
}

// DropDatabase drops the database if it exists.
func DropDatabase(ctx context.Context, name string) error {
	admin, err := pgx.Connect(ctx, AdminDSN())
	if err != nil {
		return fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("dropping database %s: %w", name, err)
	}
	return nil
}

// ConnectJetStream connects to the local NATS; close the connection after
// use.
func ConnectJetStream() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(NATSURL, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to NATS on %s (the machine's 127.0.0.1:4222 starts with: make services): %w", NATSURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("opening JetStream: %w", err)
	}
	return nc, js, nil
}
