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

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
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

// Pools caches one sink database (sink.DB) per connection string and
// kind, and counts the resources (owners) that use each. An owner uses one
// at a time: acquiring with another connection string (a rotated Secret)
// lets go of the old one, and Release lets go of it for a deleted
// resource. A database nobody uses is closed at once. PostgreSQL's is a
// pgxpool behind runtime/sink/postgres, MySQL's a database/sql pool
// (runtime/sink/mysql), both capped at MaxConnsPerDatabase connections and
// MaxMigrationsPerDatabase migrations.
type Pools struct {
	// migrationWait is MigrationWait (shorter in tests).
	migrationWait time.Duration
	mu            sync.Mutex
	pools         map[string]*sharedPool // by poolKey
	owners        map[string]string      // owner -> pool key
}

type sharedPool struct {
	db sink.DB
	// dialect is the controller's own checks for db's kind (dialect.go).
	dialect dialect
	users   int
	// migrations holds a token per migration running on the database
	// (MaxMigrationsPerDatabase).
	migrations chan struct{}
	// databases are the physical databases the pool reaches
	// (sink.DB.PhysicalDatabase), by the inbox's schema (the database on
	// MySQL), each read once.
	dbMu      sync.Mutex
	databases map[string]string
}

// physicalDatabase names the database that holds the inbox of s, read on
// first use.
func (sp *sharedPool) physicalDatabase(ctx context.Context, s config.Sink) (string, error) {
	sp.dbMu.Lock()
	defer sp.dbMu.Unlock()
	if db, ok := sp.databases[s.Schema]; ok {
		return db, nil
	}
	db, err := sp.db.PhysicalDatabase(ctx, s)
	if err != nil {
		return "", err
	}
	if sp.databases == nil {
		sp.databases = map[string]string{}
	}
	sp.databases[s.Schema] = db
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

func poolKey(kind sink.Kind, dsn string) string {
	sum := sha256.Sum256([]byte(string(kind) + "\x00" + dsn))
	return hex.EncodeToString(sum[:])
}

// acquire returns the sink database t names (its kind and connection
// string) and records that t.Owner uses it. A database not open yet is
// opened outside the cache's lock (MySQL's open reads the server's
// version); two owners opening the same one at once keep the first.
func (p *Pools) acquire(ctx context.Context, t Target) (*sharedPool, error) {
	kind := t.Sink.DatabaseKind()
	key := poolKey(kind, t.DSN)
	p.mu.Lock()
	sp, unused := p.useLocked(t.Owner, key)
	p.mu.Unlock()
	closeDB(unused)
	if sp != nil {
		return sp, nil
	}
	fresh, err := openShared(ctx, kind, t.DSN)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	sp, unused = p.useLocked(t.Owner, key)
	if sp == nil {
		sp, fresh = fresh, nil
		sp.users = 1
		p.pools[key] = sp
		p.owners[t.Owner] = key
	}
	p.mu.Unlock()
	closeDB(unused)
	if fresh != nil {
		fresh.db.Close()
	}
	return sp, nil
}

// useLocked records that owner uses the pool of key and returns it, nil
// when none is open; an owner that used another pool lets go of it, which
// is returned for the caller to close outside the lock when nobody else
// uses it.
func (p *Pools) useLocked(owner, key string) (shared *sharedPool, unused sink.DB) {
	if old, ok := p.owners[owner]; ok && old != key {
		unused = p.releaseLocked(owner)
	}
	sp, ok := p.pools[key]
	if !ok {
		return nil, unused
	}
	if _, uses := p.owners[owner]; !uses {
		sp.users++
		p.owners[owner] = key
	}
	return sp, unused
}

func closeDB(db sink.DB) {
	if db != nil {
		// Close waits for acquired connections: outside the lock.
		db.Close()
	}
}

// openShared opens the sink database of kind at dsn. A connection string
// that does not parse is an *InvalidDSNError: the parse error itself is
// dropped, because both drivers may quote the string, password included.
func openShared(ctx context.Context, kind sink.Kind, dsn string) (*sharedPool, error) {
	var db sink.DB
	var d dialect
	switch kind {
	case sink.MySQL:
		m, err := openMySQL(ctx, dsn)
		if err != nil {
			return nil, err
		}
		db, d = m, mysqlDialect{db: m}
	default:
		pool, err := openPostgres(dsn)
		if err != nil {
			return nil, err
		}
		db, d = postgres.New(pool), pgDialect{pool: pool}
	}
	return &sharedPool{db: db, dialect: d, migrations: make(chan struct{}, MaxMigrationsPerDatabase)}, nil
}

func openPostgres(dsn string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, &InvalidDSNError{Kind: sink.Postgres}
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
		return nil, fmt.Errorf("while creating a pool for the sink database: %w", err)
	}
	return pool, nil
}

// openMySQL opens a MySQL/MariaDB sink database: at most
// MaxConnsPerDatabase connections, idle ones closed after a minute, a
// connect timeout of Timeout unless the DSN sets one. Open reads the
// server's version (one round trip), bounded by Timeout.
func openMySQL(ctx context.Context, dsn string) (*mysql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, &InvalidDSNError{Kind: sink.MySQL}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = dbTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	m, err := mysql.Open(ctx, cfg.FormatDSN())
	if err != nil {
		return nil, fmt.Errorf("while opening the sink database: %w", err)
	}
	m.SetMaxConns(MaxConnsPerDatabase)
	m.SQL().SetConnMaxIdleTime(time.Minute)
	return m, nil
}

// Release records that owner no longer uses a pool; the pool is closed
// when it was the last user. Releasing an unknown owner does nothing.
func (p *Pools) Release(owner string) {
	p.mu.Lock()
	unused := p.releaseLocked(owner)
	p.mu.Unlock()
	closeDB(unused)
}

// releaseLocked drops owner's use and returns its pool when nobody uses it
// any more, for the caller to close outside the lock.
func (p *Pools) releaseLocked(owner string) sink.DB {
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
	return sp.db
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
		sp.db.Close()
		delete(p.pools, key)
	}
	clear(p.owners)
}
