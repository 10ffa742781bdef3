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

// Classify is the SQLSTATE table (classify.go).
func (DB) Classify(err error) (sink.Class, string) { return Classify(err) }

func (d DB) Inbox(s config.Sink, opts ...inbox.Option) (sink.Inbox, error) {
	st, err := inbox.New(d.Pool, s, opts...)
	if err != nil {
		return nil, err
	}
	return Inbox{st}, nil
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

// Inbox is an *inbox.Store behind the seam.
type Inbox struct{ *inbox.Store }

var _ sink.Inbox = Inbox{}

func (i Inbox) Claim(ctx context.Context, tx sink.Tx, claims []inbox.Claim) (map[string]struct{}, error) {
	ptx, ok := tx.(pgx.Tx)
	if !ok {
		return nil, sink.ErrForeignTx
	}
	return i.Store.Claim(ctx, ptx, claims)
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
