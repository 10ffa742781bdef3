package sinkdb

import (
	"context"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// Target is one resource's sink: the owner (the resource's UID, which the
// pool cache counts), its connection string and its inbox.
type Target struct {
	Owner string
	DSN   string
	Sink  config.Sink
	// Outbox: the inbox has an outbox table (config.UsesOutbox).
	Outbox bool
}

// Client is the sink database on runtime/inbox: the controller and the
// runtime share one DDL.
type Client struct {
	pools *Pools
}

// New returns a Client with an empty pool cache.
func New() *Client { return &Client{pools: NewPools()} }

// Pools is the client's pool cache.
func (c *Client) Pools() *Pools { return c.pools }

// Release lets go of owner's pool (a deleted resource).
func (c *Client) Release(owner string) { c.pools.Release(owner) }

func (c *Client) with(ctx context.Context, t Target, fn func(context.Context, *inbox.Store) error) error {
	return c.withPool(ctx, t, func(ctx context.Context, _ *sharedPool, s *inbox.Store) error { return fn(ctx, s) })
}

func (c *Client) withPool(ctx context.Context, t Target, fn func(context.Context, *sharedPool, *inbox.Store) error) error {
	sp, err := c.pools.acquireShared(t.Owner, t.DSN)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	store, err := inbox.New(sp.pool, t.Sink, inbox.WithOutbox(t.Outbox))
	if err != nil {
		return err
	}
	return fn(ctx, sp, store)
}

// Ensure creates the schema and tables idempotently and returns the schema
// version now in place. An inbox already up to date costs one query (two
// when migrated); only a missing or older one, or one without a table it
// now uses, runs the DDL. A migration refused for a privilege returns an
// *EffectProblem naming the grant that is missing.
func (c *Client) Ensure(ctx context.Context, t Target) (int, error) {
	var v int
	err := c.withPool(ctx, t, func(ctx context.Context, sp *sharedPool, s *inbox.Store) error {
		var err error
		var upToDate bool
		if v, upToDate, err = s.UpToDate(ctx); err != nil || upToDate {
			return explainInboxPrivilege(ctx, sp.pool, t.Sink.Schema, err)
		}
		if err := sp.migrate(ctx, func() error { return s.Migrate(ctx) }); err != nil {
			return explainInboxPrivilege(ctx, sp.pool, t.Sink.Schema, err)
		}
		v, err = s.SchemaVersion(ctx)
		return err
	})
	return v, err
}

// Drop drops the inbox tables; dropping what is gone succeeds.
func (c *Client) Drop(ctx context.Context, t Target) error {
	return c.with(ctx, t, func(ctx context.Context, s *inbox.Store) error { return s.Drop(ctx) })
}

// LastPrune returns the latest prune run, nil when none ran yet.
func (c *Client) LastPrune(ctx context.Context, t Target) (*inbox.PruneRun, error) {
	var run *inbox.PruneRun
	err := c.with(ctx, t, func(ctx context.Context, s *inbox.Store) error {
		var err error
		run, err = s.LastPruneRun(ctx)
		return err
	})
	return run, err
}

// OutboxStats reads the backlog of the inbox's outbox.
func (c *Client) OutboxStats(ctx context.Context, t Target) (inbox.OutboxStats, error) {
	var st inbox.OutboxStats
	err := c.with(ctx, t, func(ctx context.Context, s *inbox.Store) error {
		var err error
		st, err = s.OutboxStats(ctx)
		return err
	})
	return st, err
}

// IDConflicts counts the id conflicts the inbox kept.
func (c *Client) IDConflicts(ctx context.Context, t Target) (int64, error) {
	var n int64
	err := c.with(ctx, t, func(ctx context.Context, s *inbox.Store) error {
		var err error
		n, err = s.ConflictCount(ctx)
		return err
	})
	return n, err
}

// RedriveSummary reads what a redrive run recorded.
func (c *Client) RedriveSummary(ctx context.Context, t Target, run string) (inbox.RedriveSummary, error) {
	var sum inbox.RedriveSummary
	err := c.with(ctx, t, func(ctx context.Context, s *inbox.Store) error {
		var err error
		sum, err = s.RedriveSummary(ctx, run)
		return err
	})
	return sum, err
}

// AdoptWindow applies the shrink rule to a derived window against the state
// kept in the inbox (retention.AdoptStored) and returns what is now in
// force; pendingShrink is true while a smaller window waits.
func (c *Client) AdoptWindow(ctx context.Context, t Target, derived retention.Result, now time.Time) (applied retention.Applied, pendingShrink bool, err error) {
	err = c.with(ctx, t, func(ctx context.Context, s *inbox.Store) error {
		var err error
		applied, pendingShrink, err = retention.AdoptStored(ctx, s, derived, now)
		return err
	})
	return applied, pendingShrink, err
}

// StoredWindow reads that state without changing it; nil when none is
// stored yet.
func (c *Client) StoredWindow(ctx context.Context, t Target) (*retention.Applied, error) {
	var applied *retention.Applied
	err := c.with(ctx, t, func(ctx context.Context, s *inbox.Store) error {
		var err error
		applied, err = retention.StoredApplied(ctx, s)
		return err
	})
	return applied, err
}
