package sinkdb

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/errtext"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
)

// CheckEffect checks, read-only, that the sink can take the effect: nil
// when it can, an *EffectProblem when the sink is not ready for it (the
// reason and a message that names the table and column and says what to
// run), any other error when the check itself could not run (database
// unreachable). Nothing is written: on PostgreSQL everything runs in one
// READ ONLY transaction that is rolled back, on MySQL the statements are
// only prepared (the dialect's checkEffect).
func (c *Client) CheckEffect(ctx context.Context, t Target, cfg *config.Config) error {
	if cfg.Sink.Effect.HTTP != nil {
		return nil // nothing of the effect lives in the database
	}
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	sp, err := c.pools.acquire(ctx, t)
	if err != nil {
		return err
	}
	return sp.dialect.checkEffect(ctx, cfg)
}

func checkEffect(ctx context.Context, tx pgx.Tx, cfg *config.Config) error {
	e := cfg.Sink.Effect
	var err error
	switch {
	case e.Upsert != nil:
		err = checkTableEffect(ctx, tx, cfg.Sink.Schema, tableEffect{
			field: "spec.sink.effect.upsert", table: e.Upsert.Table, columns: e.Upsert.Columns,
			key: e.Upsert.Key, sequence: e.Upsert.SequenceColumn,
		})
	case e.Append != nil:
		err = checkTableEffect(ctx, tx, cfg.Sink.Schema, tableEffect{
			field: "spec.sink.effect.append", table: e.Append.Table, columns: e.Append.Columns,
		})
	case e.SQL != nil:
		return checkStatement(ctx, tx, e.SQL)
	}
	if err != nil {
		return err
	}
	return explainEffect(ctx, tx, cfg)
}

// explainEffect EXPLAINs the very statement the runtime runs per batch
// (never executing it): what the catalog checks above do not cover, such as
// a mapped generated column or a view that cannot take an INSERT, fails
// here as it would fail every batch.
func explainEffect(ctx context.Context, tx pgx.Tx, cfg *config.Config) error {
	eff, err := effect.New(cfg.Sink.Effect, cfg.Sink.Schema, cfg.Message.Entity)
	if err != nil {
		return fmt.Errorf("while building the effect to check it: %w", err)
	}
	stmt := effect.Statement(eff)
	if stmt == "" {
		return nil
	}
	if _, err := tx.Exec(ctx, "EXPLAIN "+stmt, "[]"); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			return fmt.Errorf("while checking the %s statement: %w", cfg.Sink.Effect.Kind(), err)
		}
		reason := messagingv1alpha1.ReasonStatementInvalid
		if pgErr.Code == "42501" {
			reason = messagingv1alpha1.ReasonPermissionDenied
		}
		return problem(reason, "the %s into %s.%s cannot run: %s (SQLSTATE %s); fix the table or spec.sink.effect.%s",
			cfg.Sink.Effect.Kind(), cfg.Sink.Schema, effectTable(cfg), errtext.Sanitize(pgErr.Message), pgErr.Code, cfg.Sink.Effect.Kind())
	}
	return nil
}

func effectTable(cfg *config.Config) string {
	if u := cfg.Sink.Effect.Upsert; u != nil {
		return u.Table
	}
	return cfg.Sink.Effect.Append.Table
}

// preflightStatement is the name the sql statement is prepared under.
const preflightStatement = "idc_effect_preflight"

// checkStatement prepares the statement (the protocol's Parse: it is never
// executed, and a second command is refused, not run) with the role's own
// search path, as the runtime runs it, checks its parameters, and EXPLAINs
// it with NULL arguments, which checks privileges without writing. The
// caller deallocates preflightStatement after the rollback.
func checkStatement(ctx context.Context, tx pgx.Tx, s *config.SQL) error {
	stmt, names, err := effect.ConvertNamedParams(s.Statement)
	if err != nil {
		return problem(messagingv1alpha1.ReasonStatementInvalid, "spec.sink.effect.sql.statement cannot be read: %v", err)
	}
	sd, err := tx.Conn().Prepare(ctx, preflightStatement, stmt)
	if err != nil {
		return statementProblem("does not prepare", err)
	}
	if len(sd.ParamOIDs) != len(names) {
		return problem(messagingv1alpha1.ReasonStatementInvalid,
			"spec.sink.effect.sql.statement declares %d parameters (%s) but PostgreSQL reads %d; use only :name parameters",
			len(names), paramList(names), len(sd.ParamOIDs))
	}
	explain := "EXPLAIN EXECUTE " + pgx.Identifier{preflightStatement}.Sanitize()
	if len(names) > 0 {
		explain += " (" + strings.TrimSuffix(strings.Repeat("NULL, ", len(names)), ", ") + ")"
	}
	if _, err := tx.Exec(ctx, explain); err != nil {
		return statementProblem("cannot run", err)
	}
	return nil
}

func statementProblem(what string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("while checking spec.sink.effect.sql.statement: %w", err)
	}
	reason := messagingv1alpha1.ReasonStatementInvalid
	hint := "fix the statement"
	switch {
	case pgErr.Code == "42501":
		reason, hint = messagingv1alpha1.ReasonPermissionDenied, "GRANT the privilege it names to the sink role"
	case pgErr.Code == "42P01":
		reason, hint = messagingv1alpha1.ReasonTableNotFound, "create the table (run the service's migration) or fix the statement"
	case pgErr.Code == "42703":
		reason, hint = messagingv1alpha1.ReasonColumnNotFound, "add the column or fix the statement"
	case pgErr.Code == "42601" && strings.Contains(pgErr.Message, "multiple commands"):
		hint = "keep one command per statement (wrap several in a function, or use a CTE)"
	}
	return problem(reason, "spec.sink.effect.sql.statement %s: %s (SQLSTATE %s); %s", what, errtext.Sanitize(pgErr.Message), pgErr.Code, hint)
}

func sortedNames(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func paramList(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = ":" + n
	}
	return strings.Join(out, ", ")
}
