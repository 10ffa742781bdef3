package sinkdb

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// Timeout bounds every database round of a reconcile so an unreachable
// database costs seconds, not a stuck worker.
const Timeout = 10 * time.Second

const dbTimeout = Timeout

// MaxConnsPerDatabase caps the connections the manager opens to one sink
// database, however many resources share it.
const MaxConnsPerDatabase = 8

// MaxMigrationsPerDatabase caps the inbox migrations (the DDL of a new or
// older inbox) the manager runs at once on one sink database, as far as
// the manager can tell one: per connection string, like the pools
// (resources with a role each on one database are not limited together). Concurrent
// DDL costs PostgreSQL far more CPU per inbox than the same DDL a few at a
// time: 1,000 new inboxes took 14.8 s of PostgreSQL CPU one at a time,
// 20.8 s two at a time and 32.8 s four at a time (the manager's default
// worker count), while two at a time finished soonest (19.8 ms of wall
// time per inbox, against 26.5 one at a time and 22.7 four at a time).
// Up-to-date checks are not gated.
const MaxMigrationsPerDatabase = 2

// Pools caches one pgx pool per connection string and counts the resources
// (owners) that use each. An owner uses one pool at a time: acquiring with
// another connection string (a rotated Secret) lets go of the old one, and
// Release lets go of it for a deleted resource. A pool nobody uses is
// closed at once.
type Pools struct {
	// migrationWait is MigrationWait (shorter in tests).
	migrationWait time.Duration
	mu            sync.Mutex
	pools         map[string]*sharedPool // by the connection string's SHA-256
	owners        map[string]string      // owner -> pool key
}

type sharedPool struct {
	pool  *pgxpool.Pool
	users int
	// migrations holds a token per migration running on the database
	// (MaxMigrationsPerDatabase).
	migrations chan struct{}
	// database is the physical database the pool reaches
	// (inbox.PhysicalDatabase), read once.
	dbOnce   sync.Mutex
	database string
}

// physicalDatabase names the database the pool reaches, read on first use.
func (sp *sharedPool) physicalDatabase(ctx context.Context) (string, error) {
	sp.dbOnce.Lock()
	defer sp.dbOnce.Unlock()
	if sp.database != "" {
		return sp.database, nil
	}
	db, err := inbox.PhysicalDatabase(ctx, sp.pool)
	if err != nil {
		return "", err
	}
	sp.database = db
	return db, nil
}

// MigrationWait bounds how long an inbox migration waits for one of its
// database's MaxMigrationsPerDatabase slots. The wait is not part of the
// migration's statement timeout (Timeout starts once a slot is held), so
// a migration queued behind slow ones is never cut short for waiting; one
// that waited this long gives up with ErrMigrationQueued, is reported as
// queued (Reconciling, reason MigrationQueued) and runs on the next check.
const MigrationWait = 2 * Timeout

// ErrMigrationQueued is an inbox migration that gave up waiting for a
// slot: the database is busy with other inboxes' migrations, not
// unreachable.
var ErrMigrationQueued = errors.New("the inbox migration gave up waiting for a migration slot")

// migrate runs fn while holding one of the database's migration tokens.
// It waits for one at most wait (and until ctx ends), then gives fn a
// context with a statement timeout of its own (Timeout) that starts only
// now: the wait never eats it.
func (sp *sharedPool) migrate(ctx context.Context, wait time.Duration, fn func(context.Context) error) error {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case sp.migrations <- struct{}{}:
	case <-timer.C:
		return fmt.Errorf("%w: waited %s for one of the %d migrations allowed at once on the sink database, all held by other inboxes' migrations",
			ErrMigrationQueued, wait, MaxMigrationsPerDatabase)
	case <-ctx.Done():
		return fmt.Errorf("while waiting for one of the %d migrations allowed at once on the sink database: %w", MaxMigrationsPerDatabase, ctx.Err())
	}
	defer func() { <-sp.migrations }()
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	return fn(ctx)
}

// NewPools returns an empty cache.
func NewPools() *Pools {
	return &Pools{migrationWait: MigrationWait, pools: map[string]*sharedPool{}, owners: map[string]string{}}
}

func poolKey(dsn string) string {
	sum := sha256.Sum256([]byte(dsn))
	return hex.EncodeToString(sum[:])
}

// acquire returns the pool for dsn and records that owner uses it.
func (p *Pools) acquire(owner, dsn string) (*pgxpool.Pool, error) {
	sp, err := p.acquireShared(owner, dsn)
	if err != nil {
		return nil, err
	}
	return sp.pool, nil
}

// acquireShared is acquire with the pool's migration gate.
func (p *Pools) acquireShared(owner, dsn string) (*sharedPool, error) {
	sp, unused, err := p.acquireLocked(owner, poolKey(dsn), dsn)
	if unused != nil {
		// Close waits for acquired connections: outside the lock.
		unused.Close()
	}
	return sp, err
}

func (p *Pools) acquireLocked(owner, key, dsn string) (shared *sharedPool, unused *pgxpool.Pool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.owners[owner]; ok && old != key {
		unused = p.releaseLocked(owner)
	}
	if sp, ok := p.pools[key]; ok {
		if _, uses := p.owners[owner]; !uses {
			sp.users++
			p.owners[owner] = key
		}
		return sp, unused, nil
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, unused, ErrInvalidDSN
	}
	pc.MaxConns = MaxConnsPerDatabase
	pc.MinConns = 0
	pc.MaxConnIdleTime = time.Minute
	pc.ConnConfig.ConnectTimeout = dbTimeout
	// The controller's statements name each resource's own tables, so
	// almost none repeats on a connection: pgx's default (prepare and cache
	// every statement) would cost each one an extra round trip and keep up
	// to 512 prepared statements per connection in the manager and in
	// PostgreSQL. They run unprepared, in one round trip each.
	pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, unused, fmt.Errorf("while creating a pool for the sink database: %w", err)
	}
	shared = &sharedPool{pool: pool, users: 1, migrations: make(chan struct{}, MaxMigrationsPerDatabase)}
	p.pools[key] = shared
	p.owners[owner] = key
	return shared, unused, nil
}

// Release records that owner no longer uses a pool; the pool is closed
// when it was the last user. Releasing an unknown owner does nothing.
func (p *Pools) Release(owner string) {
	p.mu.Lock()
	unused := p.releaseLocked(owner)
	p.mu.Unlock()
	if unused != nil {
		unused.Close()
	}
}

// releaseLocked drops owner's use and returns its pool when nobody uses it
// any more, for the caller to close outside the lock.
func (p *Pools) releaseLocked(owner string) *pgxpool.Pool {
	key, ok := p.owners[owner]
	if !ok {
		return nil
	}
	delete(p.owners, owner)
	sp := p.pools[key]
	if sp == nil {
		return nil
	}
	sp.users--
	if sp.users > 0 {
		return nil
	}
	delete(p.pools, key)
	return sp.pool
}

// Len is the number of open pools.
func (p *Pools) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pools)
}

// Owners is the number of owners holding a pool.
func (p *Pools) Owners() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.owners)
}

// Holds says whether owner holds a pool.
func (p *Pools) Holds(owner string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.owners[owner]
	return ok
}

// Close closes every pool.
func (p *Pools) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, sp := range p.pools {
		sp.pool.Close()
		delete(p.pools, key)
	}
	clear(p.owners)
}
