package sinkdb

import (
	"context"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// Target is one resource's sink: its connection string, its inbox and the
// claim it makes on it.
type Target struct {
	// Owner is the user of a connection pool the pool cache counts (the
	// resource's namespace/name, given back with Release when the resource
	// is gone). It is not the inbox's owner: that is Claim.Owner, recorded
	// in the inbox's meta row.
	Owner string
	DSN   string
	Sink  config.Sink
	// Outbox: the inbox has an outbox table (config.UsesOutbox).
	Outbox bool
	// Claim is who the resource is, the epoch it knows and what a person
	// accepted (adoption, a loss): Ensure records it in the inbox's meta
	// row, and Drop drops only an inbox it owns.
	Claim inbox.OwnerClaim
}

// Client is the sink database through the dialect seam (runtime/sink):
// the controller and the runtime share one DDL per database kind, and
// every method runs the same way on PostgreSQL and MySQL/MariaDB.
type Client struct {
	pools *Pools
}

// New returns a Client with an empty pool cache.
func New() *Client { return &Client{pools: NewPools()} }

// Pools is the client's pool cache.
func (c *Client) Pools() *Pools { return c.pools }

// Release lets go of owner's pool (a deleted resource).
func (c *Client) Release(owner string) { c.pools.Release(owner) }

func (c *Client) with(ctx context.Context, t Target, fn func(context.Context, sink.Inbox) error) error {
	return c.withPool(ctx, t, func(ctx context.Context, _ *sharedPool, in sink.Inbox) error { return fn(ctx, in) })
}

// withPool runs fn on t's inbox, in its dialect (sink.DB.Inbox), within
// Timeout; an error fn returns is narrowed by the dialect (a privilege
// refusal names the GRANT to run).
func (c *Client) withPool(ctx context.Context, t Target, fn func(context.Context, *sharedPool, sink.Inbox) error) error {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	sp, err := c.pools.acquire(ctx, t)
	if err != nil {
		return err
	}
	in, err := sp.db.Inbox(t.Sink, inbox.WithOutbox(t.Outbox))
	if err != nil {
		return err
	}
	return sp.dialect.explain(fn(ctx, sp, in), t.Sink.Schema)
}

// Ensure creates the schema and tables idempotently, records the resource
// as the inbox's owner and returns the schema version now in place and the
// inbox's identity. An inbox already up to date and owned costs two
// queries; only a missing or older one, one without a table it now uses,
// or one whose owner record changes, runs the migration. An inbox another
// resource owns is an *inbox.OwnedError, a lost one an *inbox.LostError;
// a migration refused for a privilege returns an *EffectProblem naming the
// grant that is missing.
func (c *Client) Ensure(ctx context.Context, t Target) (Ensured, error) {
	var e Ensured
	err := c.withPool(ctx, t, func(check context.Context, sp *sharedPool, in sink.Inbox) error {
		db, err := sp.physicalDatabase(check, t.Sink)
		if err != nil {
			return err
		}
		id, v, ready, err := in.Check(check, t.Claim)
		e.Version, e.Identity = v, id
		e.Identity.Database = db
		if err != nil || ready {
			return sp.dialect.explainMigrate(check, t.Sink.Schema, err)
		}
		// From the pass's own context: the wait for a migration slot has
		// its own bound, and the migration its own statement timeout.
		if err := sp.migrate(ctx, c.pools.migrationWait, func(ctx context.Context) error {
			var err error
			if e.Identity, err = in.MigrateFor(ctx, &t.Claim); err != nil {
				return sp.dialect.explainMigrate(ctx, t.Sink.Schema, err)
			}
			return nil
		}); err != nil {
			return err
		}
		e.Identity.Database = db
		e.Version, e.Migrated = inbox.SchemaVersion, true
		e.Adopted, e.Previous = !id.Owner.IsZero() && id.Owner != t.Claim.Owner, id.Owner
		return nil
	})
	return e, err
}

// Ensured is what Ensure found or made.
type Ensured struct {
	Version  int
	Identity inbox.Identity
	// Migrated: the migration ran (tables, the owner record or the epoch
	// changed); Adopted: the inbox recorded another owner before (the same
	// name with another UID, or the one a person named).
	Migrated, Adopted bool
	// Previous is the owner the inbox recorded before (when Adopted).
	Previous inbox.Owner
}

// MarkRestored marks the inbox of epoch lost (sink.Inbox.MarkRestored).
func (c *Client) MarkRestored(ctx context.Context, t Target, epoch string) error {
	return c.with(ctx, t, func(ctx context.Context, s sink.Inbox) error { return s.MarkRestored(ctx, epoch) })
}

// Drop drops the inbox tables when the inbox records t.Claim.Owner as its
// owner (inbox.ErrNotOwner otherwise); dropping what is gone succeeds.
func (c *Client) Drop(ctx context.Context, t Target) error {
	return c.with(ctx, t, func(ctx context.Context, s sink.Inbox) error { return s.DropOwned(ctx, t.Claim.Owner) })
}

// LastPrune returns the latest prune run, nil when none ran yet.
func (c *Client) LastPrune(ctx context.Context, t Target) (*inbox.PruneRun, error) {
	var run *inbox.PruneRun
	err := c.with(ctx, t, func(ctx context.Context, s sink.Inbox) error {
		var err error
		run, err = s.LastPruneRun(ctx)
		return err
	})
	return run, err
}

// OutboxStats reads the backlog of the inbox's outbox.
func (c *Client) OutboxStats(ctx context.Context, t Target) (inbox.OutboxStats, error) {
	var st inbox.OutboxStats
	err := c.with(ctx, t, func(ctx context.Context, s sink.Inbox) error {
		var err error
		st, err = s.OutboxStats(ctx)
		return err
	})
	return st, err
}

// IDConflicts counts the id conflicts the inbox kept.
func (c *Client) IDConflicts(ctx context.Context, t Target) (int64, error) {
	var n int64
	err := c.with(ctx, t, func(ctx context.Context, s sink.Inbox) error {
		var err error
		n, err = s.ConflictCount(ctx)
		return err
	})
	return n, err
}

// RedriveSummary reads what a redrive run recorded.
func (c *Client) RedriveSummary(ctx context.Context, t Target, run string) (inbox.RedriveSummary, error) {
	var sum inbox.RedriveSummary
	err := c.with(ctx, t, func(ctx context.Context, s sink.Inbox) error {
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
	err = c.with(ctx, t, func(ctx context.Context, s sink.Inbox) error {
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
	err := c.with(ctx, t, func(ctx context.Context, s sink.Inbox) error {
		var err error
		applied, err = retention.StoredApplied(ctx, s)
		return err
	})
	return applied, err
}
