package sinkdb

import (
	"context"
	"errors"
	"testing"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
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
