package mysql

import (
	"context"
	"fmt"
	"sort"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// sqlEffect runs the user's statement once per new message in the claim
// transaction. Its :name parameters are compiled into ? placeholders by
// effect.ConvertNamedParamsMySQL (the PostgreSQL effect's parser, with
// MySQL's quoting and comments) and bound from the value expressions, one
// argument per placeholder; values are never spliced into the text (the
// driver's interpolation escapes them for the connection's charset and
// sql_mode). database/sql has no pipeline, so a batch is one round trip per
// message (PostgreSQL queues them in one pgx.Batch).
type sqlEffect struct {
	stmt   string
	params []column // params[i] binds the i-th ?
}

func newSQL(cfg *config.SQL) (*sqlEffect, error) {
	stmt, names, err := effect.ConvertNamedParamsMySQL(cfg.Statement)
	if err != nil {
		return nil, fmt.Errorf("while building the sql effect: %w", err)
	}
	e := &sqlEffect{stmt: stmt}
	compiled := map[string]extract.Expr{}
	for _, n := range names {
		expr, ok := compiled[n]
		if !ok {
			src, ok := cfg.Params[n]
			if !ok {
				return nil, fmt.Errorf("while building the sql effect: statement uses :%s, which is not among params %v", n, sortedKeys(cfg.Params))
			}
			if expr, err = extract.Compile(src); err != nil {
				return nil, fmt.Errorf("while building the sql effect: param %s: %w", n, err)
			}
			compiled[n] = expr
		}
		e.params = append(e.params, column{name: n, expr: expr})
	}
	return e, nil
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Apply runs the statement for each record; a record whose parameters
// cannot be read fails alone, a statement error fails the transaction.
func (e *sqlEffect) Apply(ctx context.Context, tx sink.Tx, recs []*effect.Record) (effect.Result, error) {
	var res effect.Result
	t, err := sqlTx(tx)
	if err != nil {
		return res, err
	}
	for i, m := range recs {
		args, err := e.bind(m)
		if err != nil {
			res.Failed = append(res.Failed, effect.Failure{Index: i, Err: err})
			continue
		}
		if _, err := t.ExecContext(ctx, e.stmt, args...); err != nil {
			return res, fmt.Errorf("while running the sql effect: %w", err)
		}
		res.Applied++
	}
	return res, nil
}

func (e *sqlEffect) bind(m *effect.Record) ([]any, error) {
	args := make([]any, len(e.params))
	for i, p := range e.params {
		v, err := param(p, m)
		if err != nil {
			return nil, fmt.Errorf("param %s: %w", p.name, err)
		}
		args[i] = v
	}
	return args, nil
}
