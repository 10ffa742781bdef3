// Package postgres is the PostgreSQL dialect of the sink seam
// (runtime/sink): a thin adapter over the pgx code of runtime/inbox and
// runtime/effect, which keep their statements. A sink.Tx here is a pgx.Tx;
// the adapter only asserts it back, so the claim path allocates nothing more
// than calling the Store directly (BenchmarkSeam).
package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// DB is a PostgreSQL sink database.
type DB struct{ Pool *pgxpool.Pool }

var _ sink.DB = DB{}

// New wraps pool.
func New(pool *pgxpool.Pool) DB { return DB{Pool: pool} }

func (DB) Kind() sink.Kind { return sink.Postgres }

// Begin opens a READ COMMITTED transaction, as the consumer's loop does
// (the Partitioned claim relies on a fresh snapshot per statement).
func (d DB) Begin(ctx context.Context) (sink.Tx, error) {
	tx, err := d.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("while beginning: %w", err)
	}
	return tx, nil
}

func (d DB) Ping(ctx context.Context) error { return d.Pool.Ping(ctx) }

func (d DB) Close() { d.Pool.Close() }

// PhysicalDatabase is inbox.PhysicalDatabase: the system identifier and
// current_database() (the schema is not part of it).
func (d DB) PhysicalDatabase(ctx context.Context, _ config.Sink) (string, error) {
	return inbox.PhysicalDatabase(ctx, d.Pool)
}

// Classify is the SQLSTATE table (classify.go).
func (DB) Classify(err error) (sink.Class, string) { return Classify(err) }

func (d DB) Inbox(s config.Sink, opts ...inbox.Option) (sink.Inbox, error) {
	st, err := inbox.New(d.Pool, s, opts...)
	if err != nil {
		return nil, err
	}
	return Inbox{Store: st, pool: d.Pool}, nil
}

func (DB) Effect(cfg config.Effect, schema string, entity *config.Entity) (sink.Effect, error) {
	e, err := effect.New(cfg, schema, entity)
	if err != nil {
		return nil, err
	}
	if !e.Transactional() {
		return nil, fmt.Errorf("while building the effect: %w: a non-transactional effect runs outside the claim transaction", sink.ErrUnsupported)
	}
	return Effect{e}, nil
}

// Effect is an effect.Effect behind the seam.
type Effect struct{ effect.Effect }

func (e Effect) Apply(ctx context.Context, tx sink.Tx, recs []*effect.Record) (effect.Result, error) {
	ptx, ok := tx.(pgx.Tx)
	if !ok {
		return effect.Result{}, sink.ErrForeignTx
	}
	return e.Effect.Apply(ctx, ptx, recs)
}

// TrackChanges turns on emit.when: Changed's tracking (sink.ChangeTracker).
func (e Effect) TrackChanges() bool { return effect.TrackChanges(e.Effect) }

// Inbox is an *inbox.Store behind the seam: the Store's methods whose
// signatures are the seam's are promoted as they are; the ones below assert
// the Tx back to pgx.Tx, or pass the pool where the Store takes a Querier.
type Inbox struct {
	*inbox.Store
	pool *pgxpool.Pool
}

var _ sink.Inbox = Inbox{}

// Wrap puts a Store opened on pool behind the seam (for callers, tests
// among them, that open the Store with their own options).
func Wrap(pool *pgxpool.Pool, st *inbox.Store) Inbox { return Inbox{Store: st, pool: pool} }

// pgTx is tx as the pgx.Tx it is.
func pgTx(tx sink.Tx) (pgx.Tx, error) {
	ptx, ok := tx.(pgx.Tx)
	if !ok {
		return nil, sink.ErrForeignTx
	}
	return ptx, nil
}

func (i Inbox) Claim(ctx context.Context, tx sink.Tx, claims []inbox.Claim) (map[string]struct{}, error) {
	ptx, ok := tx.(pgx.Tx)
	if !ok {
		return nil, sink.ErrForeignTx
	}
	fresh, err := i.Store.Claim(ctx, ptx, claims)
	if err != nil {
		return nil, i.advise(err, "SELECT, INSERT")
	}
	return fresh, nil
}

func (i Inbox) Unclaim(ctx context.Context, tx sink.Tx, ids []string) error {
	ptx, ok := tx.(pgx.Tx)
	if !ok {
		return sink.ErrForeignTx
	}
	return i.Store.Unclaim(ctx, ptx, ids)
}

func (i Inbox) DeadLetter(ctx context.Context, tx sink.Tx, dls []inbox.DeadLetter) ([]bool, error) {
	ptx, ok := tx.(pgx.Tx)
	if !ok {
		return nil, sink.ErrForeignTx
	}
	return i.Store.DeadLetter(ctx, ptx, dls)
}

// PruneTable is the Store's (its signature is the seam's); spelled out so
// the seam's list of operations reads the same in both dialects.
func (i Inbox) PruneTable(ctx context.Context, b inbox.Bound, batchSize int, maxDuration time.Duration) (inbox.PruneResult, error) {
	return i.Store.PruneTable(ctx, b, batchSize, maxDuration)
}

func (i Inbox) Existing(ctx context.Context, ids []string) (map[string]struct{}, error) {
	return i.Store.Existing(ctx, i.pool, ids)
}

func (i Inbox) Conflicts(ctx context.Context, tx sink.Tx, claims []inbox.Claim, fresh map[string]struct{}) ([]inbox.Conflict, error) {
	ptx, err := pgTx(tx)
	if err != nil {
		return nil, err
	}
	return i.Store.Conflicts(ctx, ptx, claims, fresh)
}

func (i Inbox) RecordConflicts(ctx context.Context, tx sink.Tx, rows []inbox.ConflictRecord) error {
	ptx, err := pgTx(tx)
	if err != nil {
		return err
	}
	return i.Store.RecordConflicts(ctx, ptx, rows)
}

func (i Inbox) WriteOutbox(ctx context.Context, tx sink.Tx, rows []inbox.OutboxRow) error {
	ptx, err := pgTx(tx)
	if err != nil {
		return err
	}
	return i.advise(i.Store.WriteOutbox(ctx, ptx, rows), "SELECT, INSERT")
}

func (i Inbox) ClaimOutboxShard(ctx context.Context, tx sink.Tx, shard, limit int) ([]inbox.PendingEvent, bool, error) {
	ptx, err := pgTx(tx)
	if err != nil {
		return nil, false, err
	}
	events, ok, err := i.Store.ClaimOutboxShard(ctx, ptx, shard, limit)
	return events, ok, i.advise(err, "SELECT, UPDATE")
}

func (i Inbox) MarkOutboxSent(ctx context.Context, tx sink.Tx, ids []int64) error {
	ptx, err := pgTx(tx)
	if err != nil {
		return err
	}
	return i.advise(i.Store.MarkOutboxSent(ctx, ptx, ids), "SELECT, UPDATE")
}

func (i Inbox) NoteOutboxFailure(ctx context.Context, tx sink.Tx, ids []int64, reason string, counted bool) (map[int64]int, error) {
	ptx, err := pgTx(tx)
	if err != nil {
		return nil, err
	}
	n, err := i.Store.NoteOutboxFailure(ctx, ptx, ids, reason, counted)
	return n, i.advise(err, "SELECT, UPDATE")
}

func (i Inbox) DeadLetterOutbox(ctx context.Context, tx sink.Tx, e inbox.PendingEvent, reason, class string) error {
	ptx, err := pgTx(tx)
	if err != nil {
		return err
	}
	return i.adviseEach(i.Store.DeadLetterOutbox(ctx, ptx, e, reason, class),
		map[string]string{i.Names().DeadLetters: "SELECT, INSERT", i.Names().Outbox: "SELECT, DELETE"})
}

func (i Inbox) ListDeadLetters(ctx context.Context, f inbox.DeadLetterFilter, excerpt int) (inbox.DeadLetterListing, error) {
	l, err := i.Store.ListDeadLetters(ctx, i.pool, f, excerpt)
	return l, i.advise(err, "SELECT")
}

func (i Inbox) SelectDeadLetters(ctx context.Context, f inbox.DeadLetterFilter) ([]int64, error) {
	ids, err := i.Store.SelectDeadLetters(ctx, i.pool, f)
	return ids, i.advise(err, "SELECT")
}

// PruneOutbox is the Store's with its privilege error's GRANT.
func (i Inbox) PruneOutbox(ctx context.Context, window time.Duration, batchSize int, maxDuration time.Duration) (int64, error) {
	n, err := i.Store.PruneOutbox(ctx, window, batchSize, maxDuration)
	return n, i.advise(err, "SELECT, UPDATE, DELETE")
}

// OutboxStats is the Store's with its privilege error's GRANT.
func (i Inbox) OutboxStats(ctx context.Context) (inbox.OutboxStats, error) {
	st, err := i.Store.OutboxStats(ctx)
	return st, i.advise(err, "SELECT")
}

// RedriveSummary is the Store's with its privilege error's GRANT.
func (i Inbox) RedriveSummary(ctx context.Context, run string) (inbox.RedriveSummary, error) {
	sum, err := i.Store.RedriveSummary(ctx, run)
	return sum, i.advise(err, "SELECT")
}

func (i Inbox) LockDeadLetter(ctx context.Context, tx sink.Tx, id int64) (*inbox.StoredDeadLetter, error) {
	ptx, err := pgTx(tx)
	if err != nil {
		return nil, err
	}
	d, err := i.Store.LockDeadLetter(ctx, ptx, id)
	return d, i.advise(err, "SELECT, UPDATE")
}

func (i Inbox) DeleteDeadLetter(ctx context.Context, tx sink.Tx, id int64) error {
	ptx, err := pgTx(tx)
	if err != nil {
		return err
	}
	return i.advise(i.Store.DeleteDeadLetter(ctx, ptx, id), "SELECT, DELETE")
}

func (i Inbox) FailDeadLetterAgain(ctx context.Context, tx sink.Tx, id int64, reason, class string) error {
	ptx, err := pgTx(tx)
	if err != nil {
		return err
	}
	return i.advise(i.Store.FailDeadLetterAgain(ctx, ptx, id, reason, class), "SELECT, UPDATE")
}

func (i Inbox) RecordRedrive(ctx context.Context, tx sink.Tx, r inbox.Redrive) error {
	ptx, err := pgTx(tx)
	if err != nil {
		return err
	}
	return i.advise(i.Store.RecordRedrive(ctx, ptx, r), "INSERT")
}

func (i Inbox) RequeueOutbox(ctx context.Context, tx sink.Tx, d inbox.StoredDeadLetter) error {
	ptx, err := pgTx(tx)
	if err != nil {
		return err
	}
	return i.advise(i.Store.RequeueOutbox(ctx, ptx, d), "SELECT, INSERT, UPDATE")
}
