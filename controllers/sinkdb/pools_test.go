package sinkdb

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

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
// one more waits for a token and gives up with its context.
func TestMigrationsPerDatabaseAreGated(t *testing.T) {
	sp := &sharedPool{migrations: make(chan struct{}, MaxMigrationsPerDatabase)}
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, MaxMigrationsPerDatabase)
	for range MaxMigrationsPerDatabase {
		go func() {
			done <- sp.migrate(context.Background(), func() error { entered <- struct{}{}; <-release; return nil })
		}()
	}
	for range MaxMigrationsPerDatabase {
		<-entered
	}

	if len(sp.migrations) != cap(sp.migrations) {
		t.Fatalf("%d migrations running hold %d of %d tokens", MaxMigrationsPerDatabase, len(sp.migrations), cap(sp.migrations))
	}
	// Every token is held: a migration whose context ends first never runs.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	ran := false
	err := sp.migrate(ctx, func() error { ran = true; return nil })
	if ran || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with %d migrations running, one more ran=%v err=%v; want it to wait and give up with its context", MaxMigrationsPerDatabase, ran, err)
	}

	// One finishes: the next one runs.
	release <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := sp.migrate(context.Background(), func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("after one finished, the next migration ran=%v err=%v", ran, err)
	}
	close(release)
	for range MaxMigrationsPerDatabase - 1 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// Many new inboxes on one database at once all get migrated through the
// gate.
func TestConcurrentEnsuresAllMigrate(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	c := New()
	t.Cleanup(c.Pools().Close)
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
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	sp, err := c.Pools().acquireShared("0", dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cap(sp.migrations) != MaxMigrationsPerDatabase {
		t.Fatalf("the pool's gate holds %d tokens, want %d", cap(sp.migrations), MaxMigrationsPerDatabase)
	}
}
