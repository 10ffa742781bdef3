package sinkdb

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// Pools are shared by the owners of one connection string, follow an owner
// whose Secret rotated to another string, and close with their last user.
func TestPoolsEvictOnReleaseAndRotation(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	rotated := dsn + "&application_name=rotated"
	c := New()
	t.Cleanup(c.Pools().Close)
	ctx := context.Background()
	sink := config.Sink{Schema: "public", InboxTable: "inbox_pools", Layout: config.LayoutTable}
	ping := func(owner, dsn string) {
		t.Helper()
		if _, err := c.Ensure(ctx, Target{Owner: owner, DSN: dsn, Sink: sink}); err != nil {
			t.Fatalf("%s: %v", owner, err)
		}
	}
	want := func(pools, owners int) {
		t.Helper()
		if got := c.Pools().Len(); got != pools {
			t.Fatalf("%d pools open, want %d", got, pools)
		}
		if got := c.Pools().Owners(); got != owners {
			t.Fatalf("%d owners hold a pool, want %d", got, owners)
		}
	}

	ping("a", dsn)
	ping("b", dsn)
	want(1, 2)

	// a's Secret rotated: a moves to a new pool, b keeps the old one.
	ping("a", rotated)
	want(2, 2)

	// b is deleted: the old string's pool closes with its last user.
	c.Release("b")
	want(1, 1)
	c.Release("b") // twice is harmless
	want(1, 1)

	c.Release("a")
	want(0, 0)

	// A released owner that comes back gets a fresh pool.
	ping("a", rotated)
	want(1, 1)
}

func TestInvalidDSNIsNotEchoed(t *testing.T) {
	c := New()
	t.Cleanup(c.Pools().Close)
	_, err := c.Ensure(context.Background(), Target{Owner: "x", DSN: "postgres://u:s3cret@[::1", Sink: config.Sink{Schema: "public", InboxTable: "inbox"}})
	if !errors.Is(err, ErrInvalidDSN) {
		t.Fatalf("Ensure = %v, want ErrInvalidDSN", err)
	}
	if c.Pools().Len() != 0 || c.Pools().Owners() != 0 {
		t.Fatalf("a DSN that does not parse left %d pools, %d owners", c.Pools().Len(), c.Pools().Owners())
	}
}

// At most MaxMigrationsPerDatabase migrations run at once on one database;
// one more waits for a token and gives up, saying so, after its wait bound
// (or with its context).
func TestMigrationsPerDatabaseAreGated(t *testing.T) {
	sp := &sharedPool{migrations: make(chan struct{}, MaxMigrationsPerDatabase)}
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, MaxMigrationsPerDatabase)
	for range MaxMigrationsPerDatabase {
		go func() {
			done <- sp.migrate(context.Background(), time.Minute, func(context.Context) error { entered <- struct{}{}; <-release; return nil })
		}()
	}
	for range MaxMigrationsPerDatabase {
		<-entered
	}

	if len(sp.migrations) != cap(sp.migrations) {
		t.Fatalf("%d migrations running hold %d of %d tokens", MaxMigrationsPerDatabase, len(sp.migrations), cap(sp.migrations))
	}
	// Every token is held: a migration that waited its bound never runs
	// and says it was queued.
	ran := false
	err := sp.migrate(context.Background(), 50*time.Millisecond, func(context.Context) error { ran = true; return nil })
	if ran || !errors.Is(err, ErrMigrationQueued) {
		t.Fatalf("with %d migrations running, one more ran=%v err=%v; want it to wait and give up with ErrMigrationQueued", MaxMigrationsPerDatabase, ran, err)
	}
	// ... and one whose context ends first gives up with its context.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sp.migrate(ctx, time.Minute, func(context.Context) error { ran = true; return nil }); ran || !errors.Is(err, context.Canceled) {
		t.Fatalf("a migration whose context ended ran=%v err=%v; want context.Canceled", ran, err)
	}

	// One finishes: the next one runs.
	release <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := sp.migrate(context.Background(), time.Minute, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("after one finished, the next migration ran=%v err=%v", ran, err)
	}
	close(release)
	for range MaxMigrationsPerDatabase - 1 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// The wait for a slot does not eat the migration's statement timeout: a
// migration that waited gets the whole Timeout from when it starts.
func TestMigrationWaitDoesNotEatTheTimeout(t *testing.T) {
	sp := &sharedPool{migrations: make(chan struct{}, MaxMigrationsPerDatabase)}
	for range MaxMigrationsPerDatabase {
		sp.migrations <- struct{}{}
	}
	const waited = 300 * time.Millisecond
	go func() { time.Sleep(waited); <-sp.migrations }()
	var left time.Duration
	err := sp.migrate(context.Background(), time.Minute, func(ctx context.Context) error {
		deadline, ok := ctx.Deadline()
		if !ok {
			return errors.New("the migration runs without a statement timeout")
		}
		left = time.Until(deadline)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if left < Timeout-waited/2 || left > Timeout {
		t.Fatalf("after waiting %s for a slot the migration had %s of its %s timeout left; want all of it", waited, left, Timeout)
	}
}

// gatedSchemaLock holds the advisory lock every inbox migration into a new
// schema takes first (inbox.ensureSchema: pg_advisory_xact_lock(key, 1) with
// key the CRC-32 of "schema:<name>"), so every migration past the gate
// waits on it where PostgreSQL shows it (pg_locks). waiting counts them.
func gatedSchemaLock(t *testing.T, dsn, schema string) (waiting func() int, unlock func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key := int32(crc32.ChecksumIEEE([]byte("schema:" + schema)))
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1::int, 1)", key); err != nil {
		t.Fatal(err)
	}
	watch, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = watch.Close(ctx) })
	waiting = func() int {
		var n int
		// An advisory lock on two int4 keys is classid, objid = the keys, objsubid 2.
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND objsubid = 2 AND objid = 1 AND classid::bigint = $1::bigint
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, int64(uint32(key))).Scan(&n); err != nil {
			t.Error(err)
		}
		return n
	}
	var once sync.Once
	unlock = func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	t.Cleanup(unlock)
	return waiting, unlock
}

// Many new inboxes on one database at once all get migrated through the
// gate, and PostgreSQL never sees more than MaxMigrationsPerDatabase of
// them at once: the migrations are held where the database shows them
// (waiting on the new schema's DDL lock) and counted there.
func TestConcurrentEnsuresAllMigrate(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	c := New()
	t.Cleanup(c.Pools().Close)
	waiting, unlock := gatedSchemaLock(t, dsn, "gated")
	n := 3 * MaxMigrationsPerDatabase
	errs := make(chan error, n)
	for i := range n {
		go func() {
			sink := config.Sink{Schema: "gated", InboxTable: fmt.Sprintf("inbox_%d", i), Layout: config.LayoutTable}
			v, err := c.Ensure(context.Background(), Target{Owner: fmt.Sprint(i), DSN: dsn, Sink: sink})
			if err == nil && v.Version != inbox.SchemaVersion {
				err = fmt.Errorf("inbox_%d at schema version %d, want %d", i, v.Version, inbox.SchemaVersion)
			}
			errs <- err
		}()
	}
	// Every Ensure is past its up-to-date check well within this; the most
	// migrations PostgreSQL sees at once is what the gate let through.
	most := 0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		most = max(most, waiting())
	}
	unlock()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if most != MaxMigrationsPerDatabase {
		t.Fatalf("PostgreSQL saw at most %d of %d inbox migrations at once; want the gate's %d (more: the gate let them through; fewer: the test saw none)",
			most, n, MaxMigrationsPerDatabase)
	}
	sp, err := c.Pools().acquire(context.Background(), Target{Owner: "0", DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	if cap(sp.migrations) != MaxMigrationsPerDatabase {
		t.Fatalf("the pool's gate holds %d tokens, want %d", cap(sp.migrations), MaxMigrationsPerDatabase)
	}
}

// A migration that gives up waiting for a slot says so: MigrationQueued
// (not stalled, not "cannot reach"), while the ones holding the slots
// finish once the database lets them.
func TestQueuedMigrationIsReportedAsQueued(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	c := New()
	c.Pools().migrationWait = 500 * time.Millisecond
	t.Cleanup(c.Pools().Close)
	waiting, unlock := gatedSchemaLock(t, dsn, "queued")
	n := MaxMigrationsPerDatabase + 1
	errs := make(chan error, n)
	for i := range n {
		go func() {
			sink := config.Sink{Schema: "queued", InboxTable: fmt.Sprintf("inbox_%d", i), Layout: config.LayoutTable}
			_, err := c.Ensure(context.Background(), Target{Owner: fmt.Sprint(i), DSN: dsn, Sink: sink})
			errs <- err
		}()
	}
	queued := <-errs // the one without a slot gives up first
	if got := waiting(); got != MaxMigrationsPerDatabase {
		t.Errorf("%d migrations waiting in PostgreSQL, want %d", got, MaxMigrationsPerDatabase)
	}
	unlock()
	for range n - 1 {
		if err := <-errs; err != nil {
			t.Fatalf("a migration holding a slot: %v", err)
		}
	}
	if !errors.Is(queued, ErrMigrationQueued) {
		t.Fatalf("the migration without a slot returned %v, want ErrMigrationQueued", queued)
	}
	reason, msg := Classify(queued, messagingv1alpha1.SecretKeyRef{Name: "db", Key: "dsn"})
	if reason != messagingv1alpha1.ReasonMigrationQueued || strings.Contains(msg, "cannot reach") || !strings.Contains(msg, "queued") {
		t.Fatalf("Classify = %s: %q; want MigrationQueued saying it was queued", reason, msg)
	}
}
