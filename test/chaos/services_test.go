package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
)

// natsURL is the NATS JetStream server of the run (TestMain): the built
// nats-server 2.15.3 the suite starts itself, or with IDC_TEST_NATS=system
// the machine's (Debian's 2.9.10 on 127.0.0.1:4222).
var natsURL string

const (
	// runtimeAppName is the application_name the runtime sets on its
	// connections when the DSN names none: how the driver finds them.
	runtimeAppName = "idc-runtime"
)

// database is a PostgreSQL database private to one run, dropped (its
// connections forced out) at the end.
type database struct {
	name string
	dsn  string
	pool *pgxpool.Pool // the test's own connections (no application_name)
}

func newDatabase(t *testing.T) *database {
	t.Helper()
	name, dsn := pgtest.Create(t, "idc_chaos_test")
	db := &database{name: name, dsn: dsn}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db.pool = pool
	return db
}

func (db *database) exec(t *testing.T, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := db.pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("running %q: %v", s, err)
		}
	}
}

func (db *database) queryInt(ctx context.Context, sql string, args ...any) (int, error) {
	var n int
	if err := db.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("running %q: %w", sql, err)
	}
	return n, nil
}

// connectionCutter terminates the runtime's backends in one database, as an
// operator's pg_terminate_backend, a failover or a proxy restart would. Its
// own connection is to the maintenance database, so it survives its cuts.
type connectionCutter struct {
	admin  *pgx.Conn
	dbName string
}

func newConnectionCutter(t *testing.T, dbName string) *connectionCutter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, pgtest.AdminDSN())
	if err != nil {
		t.Fatalf("PostgreSQL is required for the chaos suite and is unreachable: %v", err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	return &connectionCutter{admin: admin, dbName: dbName}
}

// cut returns how many backends it terminated.
func (c *connectionCutter) cut(ctx context.Context) (int, error) {
	var n int
	err := c.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE datname = $1 AND application_name = $2 AND pid <> pg_backend_pid()`,
		c.dbName, runtimeAppName).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("while terminating the runtime's backends: %w", err)
	}
	return n, nil
}

// stream is a JetStream stream private to one run, deleted at the end.
type stream struct {
	js      jetstream.JetStream
	name    string
	subject string
}

func newStream(t *testing.T) *stream {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatalf("NATS JetStream at %s is required for the chaos suite: %v", natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4000))
	if err != nil {
		t.Fatal(err)
	}
	id := time.Now().UnixNano()
	s := &stream{js: js, name: fmt.Sprintf("IDC_CHAOS_%d", id), subject: fmt.Sprintf("idc.chaos.%d.events", id)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// No publish carries a Nats-Msg-Id header, so the stream's duplicate
	// window never applies: every re-sent copy is stored and delivered
	// (the dedup id travels in the payload, $.eventId). The run checks the
	// stored count and every PubAck's Duplicate flag to prove it.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s.name, Subjects: []string{s.subject}}); err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, s.name); err != nil {
			t.Errorf("deleting stream %s: %v", s.name, err)
		}
	})
	return s
}

// addConsumer creates a durable pull consumer; AckWait is the lease after
// which a killed replica's batch is redelivered. MaxDeliver stays unlimited:
// a bounded one would let the broker drop messages, which is not the
// runtime's doing.
func (s *stream) addConsumer(t *testing.T, name string, ackWait time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.js.CreateConsumer(ctx, s.name, jetstream.ConsumerConfig{
		Durable: name, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxAckPending: 10000,
	})
	if err != nil {
		t.Fatalf("creating consumer %s: %v", name, err)
	}
}

// outstanding is what a consumer has not settled: undelivered plus
// delivered-but-unacknowledged messages.
func (s *stream) outstanding(ctx context.Context, consumer string) (pending uint64, ackPending int, err error) {
	c, err := s.js.Consumer(ctx, s.name, consumer)
	if err != nil {
		return 0, 0, fmt.Errorf("while reading consumer %s: %w", consumer, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("while reading consumer %s: %w", consumer, err)
	}
	return info.NumPending, info.NumAckPending, nil
}

func (s *stream) stored(ctx context.Context) (uint64, error) {
	st, err := s.js.Stream(ctx, s.name)
	if err != nil {
		return 0, fmt.Errorf("while reading stream %s: %w", s.name, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("while reading stream %s: %w", s.name, err)
	}
	return info.State.Msgs, nil
}
