package sinkdb

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// dialect is what the controller's own checks do differently per sink
// database kind, chosen once when a pool is opened (openShared):
// PostgreSQL's catalog queries (effect.go, catalog.go, privileges.go) or
// MySQL's information_schema and server-side prepares (mysql_check.go).
// Everything else goes through runtime/sink's seam.
type dialect interface {
	// checkEffect is the read-only EffectReady preflight of an upsert,
	// append or sql effect: nil, an *EffectProblem, or an error when the
	// check could not run.
	checkEffect(ctx context.Context, cfg *config.Config) error
	// explainMigrate narrows a migration (or up-to-date check) refused for
	// a privilege to an *EffectProblem naming the grant missing; any other
	// error is returned as it is.
	explainMigrate(ctx context.Context, schema string, err error) error
	// explain adds what to run to an error of any inbox operation
	// (a privilege refusal names its GRANT); nil stays nil.
	explain(err error, schema string) error
}

// pgDialect is PostgreSQL's.
type pgDialect struct{ pool *pgxpool.Pool }

// checkEffect runs in one READ ONLY transaction that is rolled back.
func (d pgDialect) checkEffect(ctx context.Context, cfg *config.Config) error {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("while connecting for the effect check: %w", err)
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("while beginning the effect check: %w", err)
	}
	err = checkEffect(ctx, tx, cfg)
	_ = tx.Rollback(ctx)
	if cfg.Sink.Effect.SQL != nil {
		// Prepared statements outlive the transaction; this one must not
		// outlive the check on a pooled connection.
		_ = conn.Conn().Deallocate(ctx, preflightStatement)
	}
	return err
}

func (d pgDialect) explainMigrate(ctx context.Context, schema string, err error) error {
	return explainInboxPrivilege(ctx, d.pool, schema, err)
}

// explain: PostgreSQL's errors are classified as they are (Classify).
func (pgDialect) explain(err error, _ string) error { return err }
