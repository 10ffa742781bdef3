// Package effect applies the business effect of new messages: upsert,
// append and sql inside the claim transaction (set-based where the mode
// allows), http outside it with an Idempotency-Key header.
package effect

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
)

// Record is one new message: the delivery plus its extracted id.
type Record = extract.Message

// Effect applies the configured effect to a batch of new messages.
type Effect interface {
	// Transactional reports whether Apply runs inside the claim transaction
	// (upsert, append, sql). The http effect does not: the loop calls it
	// before the transaction and claims only the ids that succeeded.
	Transactional() bool
	// Apply applies recs. tx is nil for a non-transactional effect. An error
	// fails the whole batch (the loop rolls back and retries or bisects);
	// problems of single records are reported in Result.Failed instead.
	Apply(ctx context.Context, tx pgx.Tx, recs []*Record) (Result, error)
}

// Result is what Apply did.
type Result struct {
	// Applied counts records whose effect was written or called.
	Applied int
	// Stale counts records refused by the sequence gate or superseded by a
	// newer record of the same key in the batch.
	Stale int
	// Failed lists records that could not be applied; the others were.
	Failed []Failure
	// Changed lists (ascending indexes into recs) the records whose effect
	// changed state. Only an upsert after TrackChanges fills it: there a
	// record refused by the sequence gate or superseded in its batch did
	// not change anything.
	Changed []int
}

// TrackChanges makes an upsert report Result.Changed (one statement that
// also returns the positions of the rows it wrote) and reports true; the
// other effects change state with every applied record and report false.
func TrackChanges(e Effect) bool {
	if u, ok := e.(*upsertEffect); ok {
		u.track = true
		return true
	}
	return false
}

// Failure is one record that could not be applied.
type Failure struct {
	// Index into the recs passed to Apply.
	Index int
	Err   error
	// Retryable is true for a failure that may pass later (an http 5xx or
	// timeout); false means dead-letter it.
	Retryable bool
	// Outage marks a retryable failure that says nothing about the record:
	// the endpoint was unreachable, timed out, or answered 503/429. The loop
	// does not count it toward the record's attempts unless other calls of
	// the same round got through.
	Outage bool
}

// New builds the configured effect. schema is the sink schema holding the
// effect's table; entity is the message entity config (may be nil), whose
// sequence orders an upsert batch when the upsert has no sequence column.
func New(cfg config.Effect, schema string, entity *config.Entity) (Effect, error) {
	switch {
	case cfg.Upsert != nil:
		return newUpsert(cfg.Upsert, schema, entity)
	case cfg.Append != nil:
		return newAppend(cfg.Append, schema)
	case cfg.SQL != nil:
		return newSQL(cfg.SQL)
	case cfg.HTTP != nil:
		return newHTTP(cfg.HTTP)
	}
	return nil, errors.New("while building the effect: no effect configured")
}

// Statement returns the one statement an upsert or append effect runs per
// batch (its one parameter is the batch as a jsonb array of rows), and ""
// for the other effects. The controller's preflight EXPLAINs it.
func Statement(e Effect) string {
	switch x := e.(type) {
	case *appendEffect:
		return x.stmt
	case *upsertEffect:
		return x.stmt
	}
	return ""
}

// column is one target column and its compiled value expression.
type column struct {
	name string
	expr extract.Expr
}

// compileColumns compiles the column map in a stable (sorted) order, so the
// generated SQL is the same on every replica and restart.
func compileColumns(cols map[string]string) ([]column, error) {
	names, exprs, err := CompileSorted(cols)
	if err != nil {
		return nil, err
	}
	out := make([]column, len(names))
	for i, n := range names {
		out[i] = column{name: n, expr: exprs[i]}
	}
	return out, nil
}

// CompileSorted returns the columns of cols in sorted order with each value
// expression compiled, so that every dialect generates the same SQL on every
// replica and restart.
func CompileSorted(cols map[string]string) ([]string, []extract.Expr, error) {
	names := make([]string, 0, len(cols))
	for n := range cols {
		names = append(names, n)
	}
	sort.Strings(names)
	exprs := make([]extract.Expr, len(names))
	for i, n := range names {
		e, err := extract.Compile(cols[n])
		if err != nil {
			return nil, nil, fmt.Errorf("column %s: %w", n, err)
		}
		exprs[i] = e
	}
	return names, exprs, nil
}
