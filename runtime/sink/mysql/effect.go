package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// column is one target column and its value expression.
type column struct {
	name string
	expr extract.Expr
}

// compileColumns compiles the columns in sorted order (the same SQL on
// every replica, effect.CompileSorted) and validates each name.
func compileColumns(cols map[string]string) ([]column, error) {
	names, exprs, err := effect.CompileSorted(cols)
	if err != nil {
		return nil, err
	}
	out := make([]column, len(names))
	for i, n := range names {
		if err := ValidIdentifier(n); err != nil {
			return nil, fmt.Errorf("column: %w", err)
		}
		out[i] = column{name: n, expr: exprs[i]}
	}
	return out, nil
}

func columnList(cols []column) string {
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = quote(c.name)
	}
	return strings.Join(names, ", ")
}

// param is a record's value for a column, as MySQL converts it to the
// column's type: a JSON string as text, a number as its exact text, a
// boolean as 1 or 0 (MySQL's BOOLEAN is TINYINT), null as NULL, an object
// or array as its JSON text.
func param(c column, m *effect.Record) (any, error) {
	raw, err := c.expr.JSON(m)
	if err != nil {
		return nil, fmt.Errorf("column %s: %w", c.name, err)
	}
	switch {
	case len(raw) == 0:
		return nil, nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("column %s: %w", c.name, err)
		}
		return s, nil
	case string(raw) == "null":
		return nil, nil
	case string(raw) == "true":
		return 1, nil
	case string(raw) == "false":
		return 0, nil
	}
	return string(raw), nil
}

func (c column) values(m *effect.Record, into []any) ([]any, error) {
	v, err := param(c, m)
	if err != nil {
		return into, err
	}
	return append(into, v), nil
}

// appendEffect inserts one row per new message, in one statement.
type appendEffect struct {
	cols  []column
	table string
	list  string
}

func newAppend(cfg *config.Append, db string) (*appendEffect, error) {
	if err := ValidIdentifier(cfg.Table); err != nil {
		return nil, fmt.Errorf("while building the append effect: table: %w", err)
	}
	cols, err := compileColumns(cfg.Columns)
	if err != nil {
		return nil, fmt.Errorf("while building the append effect: %w", err)
	}
	return &appendEffect{cols: cols, table: qualify(db, cfg.Table), list: columnList(cols)}, nil
}

func (a *appendEffect) Apply(ctx context.Context, tx sink.Tx, recs []*effect.Record) (effect.Result, error) {
	var res effect.Result
	t, err := sqlTx(tx)
	if err != nil {
		return res, err
	}
	args := make([]any, 0, len(recs)*len(a.cols))
	n := 0
	for i, m := range recs {
		row, err := rowArgs(a.cols, m)
		if err != nil {
			res.Failed = append(res.Failed, effect.Failure{Index: i, Err: err})
			continue
		}
		args = append(args, row...)
		n++
	}
	if n == 0 {
		return res, nil
	}
	r, err := t.ExecContext(ctx, `INSERT INTO `+a.table+` (`+a.list+`) VALUES `+placeholders(n, len(a.cols)), args...)
	if err != nil {
		return res, fmt.Errorf("while appending %d rows: %w", n, err)
	}
	affected, err := r.RowsAffected()
	if err != nil {
		return res, fmt.Errorf("while appending %d rows: %w", n, err)
	}
	res.Applied = int(affected)
	return res, nil
}

func rowArgs(cols []column, m *effect.Record) ([]any, error) {
	row := make([]any, 0, len(cols))
	var err error
	for _, c := range cols {
		if row, err = c.values(m, row); err != nil {
			return nil, err
		}
	}
	return row, nil
}

// testHookAfterPreRead, when set (tests only), runs between the upsert's
// pre-read and its write: where a concurrent insert of a new key lands.
var testHookAfterPreRead func()

// upsertEffect writes the latest state per key behind the sequence gate:
// a locking pre-read of the batch's keys (exact counts), then one gated
// INSERT … ON DUPLICATE KEY UPDATE (the gate itself).
//
// The batch is collapsed, and the pre-read's rows matched, by the key's
// text as the message carries it. The state is always the database's
// (the gate runs in the statement, under the key's own comparison); the
// counts (applied, stale, changed) are exact when the key column compares
// that text byte for byte (integers, binary or _bin-collated strings). A
// case-insensitive collation, or a type whose stored text differs from the
// message's (DECIMAL, DATETIME), can make them approximate.
type upsertEffect struct {
	cols   []column
	keyIdx []int
	seqIdx int // the sequence column's index in cols, -1 without one
	// seq orders a key's records: the sequence column, else the entity
	// sequence, else nil (the later record wins).
	seq    func(*effect.Record) (int64, error)
	insert string // … VALUES without the rows; upsertTail after them
	tail   string
	read   string // SELECT keys, seq … WHERE (keys) IN without the list
}

func newUpsert(cfg *config.Upsert, db string, entity *config.Entity) (*upsertEffect, error) {
	if err := ValidIdentifier(cfg.Table); err != nil {
		return nil, fmt.Errorf("while building the upsert effect: table: %w", err)
	}
	cols, err := compileColumns(cfg.Columns)
	if err != nil {
		return nil, fmt.Errorf("while building the upsert effect: %w", err)
	}
	u := &upsertEffect{cols: cols, seqIdx: -1}
	var keys []string
	for _, k := range cfg.Key {
		i := slices.IndexFunc(cols, func(c column) bool { return c.name == k })
		if i < 0 {
			return nil, fmt.Errorf("while building the upsert effect: key column %q is not among columns", k)
		}
		u.keyIdx = append(u.keyIdx, i)
		keys = append(keys, quote(k))
	}
	switch {
	case cfg.SequenceColumn != "":
		u.seqIdx = slices.IndexFunc(cols, func(c column) bool { return c.name == cfg.SequenceColumn })
		if u.seqIdx < 0 {
			return nil, fmt.Errorf("while building the upsert effect: sequence column %q is not among columns", cfg.SequenceColumn)
		}
		expr := cols[u.seqIdx].expr
		u.seq = func(m *effect.Record) (int64, error) { return expr.Int(m) }
	case entity != nil:
		x, err := extract.CompileExtractor(entity.Sequence)
		if err != nil {
			return nil, fmt.Errorf("while building the upsert effect: entity sequence: %w", err)
		}
		u.seq = x.Int
	}
	table := qualify(db, cfg.Table)
	u.insert = `INSERT INTO ` + table + ` (` + columnList(cols) + `) VALUES `
	var sets []string
	gate := ""
	if u.seqIdx >= 0 {
		s := quote(cfg.SequenceColumn)
		gate = s + ` IS NULL OR ` + s + ` < VALUES(` + s + `)`
	}
	for i, c := range cols {
		if slices.Contains(u.keyIdx, i) || i == u.seqIdx {
			continue
		}
		sets = append(sets, assign(c.name, gate))
	}
	if u.seqIdx >= 0 {
		// Last: MySQL evaluates the assignments in order, each seeing the
		// ones before it, so the gate must read the stored sequence.
		sets = append(sets, assign(cfg.SequenceColumn, gate))
	}
	if len(sets) == 0 {
		sets = []string{quote(cfg.Key[0]) + ` = ` + quote(cfg.Key[0])} // keys only: insert what is missing
	}
	u.tail = ` ON DUPLICATE KEY UPDATE ` + strings.Join(sets, ", ")
	if u.seqIdx >= 0 {
		u.read = `SELECT ` + strings.Join(keys, ", ") + `, ` + quote(cfg.SequenceColumn) + ` FROM ` + table + ` WHERE (` + strings.Join(keys, ", ") + `) IN `
	}
	return u, nil
}

func assign(col, gate string) string {
	q := quote(col)
	if gate == "" {
		return q + ` = VALUES(` + q + `)`
	}
	return q + ` = IF(` + gate + `, VALUES(` + q + `), ` + q + `)`
}

func (u *upsertEffect) Apply(ctx context.Context, tx sink.Tx, recs []*effect.Record) (effect.Result, error) {
	var res effect.Result
	t, err := sqlTx(tx)
	if err != nil {
		return res, err
	}
	keyed := make([]effect.Keyed, 0, len(recs))
	rows := make([][]any, len(recs))
	keyArgs := make([][]any, len(recs))
	for i, m := range recs {
		k, err := u.evaluate(m, i, rows, keyArgs)
		if err != nil {
			res.Failed = append(res.Failed, effect.Failure{Index: i, Err: err})
			continue
		}
		keyed = append(keyed, k)
	}
	if len(keyed) == 0 {
		return res, nil
	}
	winners := effect.Collapse(keyed, u.seq != nil)
	write, stored, err := u.gated(ctx, t, winners, keyArgs)
	if err != nil {
		return res, err
	}
	if len(write) == 0 {
		res.Stale = len(keyed)
		return res, nil
	}
	args := make([]any, 0, len(write)*len(u.cols))
	for _, w := range write {
		args = append(args, rows[w.Index]...)
	}
	r, err := t.ExecContext(ctx, u.insert+placeholders(len(write), len(u.cols))+u.tail, args...)
	if err != nil {
		return res, fmt.Errorf("while upserting %d rows: %w", len(write), err)
	}
	affected, err := r.RowsAffected()
	if err != nil {
		return res, fmt.Errorf("while upserting %d rows: %w", len(write), err)
	}
	if u.seqIdx < 0 && len(u.cols) == len(u.keyIdx) {
		// Keys only: what was missing was inserted, the rest is there.
		res.Applied = int(affected)
		res.Stale = len(keyed) - res.Applied
		return res, nil
	}
	if write, err = u.applied(ctx, t, write, stored, affected, keyArgs); err != nil {
		return res, err
	}
	for _, w := range write {
		res.Changed = append(res.Changed, w.Index)
	}
	sort.Ints(res.Changed)
	res.Applied = len(write)
	res.Stale = len(keyed) - res.Applied
	return res, nil
}

// gated returns the winners the gate lets through, read under lock, and
// the stored sequences it read; without a sequence column, every winner.
func (u *upsertEffect) gated(ctx context.Context, t *sql.Tx, winners []effect.Keyed, keyArgs [][]any) ([]effect.Keyed, map[string]*int64, error) {
	if u.seqIdx < 0 {
		return winners, nil, nil
	}
	stored, err := u.readStored(ctx, t, winners, keyArgs)
	if err != nil {
		return nil, nil, err
	}
	if testHookAfterPreRead != nil {
		testHookAfterPreRead()
	}
	write := make([]effect.Keyed, 0, len(winners))
	for _, w := range winners {
		if cur, ok := stored[w.Key]; ok && cur != nil && *cur >= w.Seq {
			continue // refused by the gate
		}
		write = append(write, w)
	}
	return write, stored, nil
}

// applied returns the written winners the gate let through: all of them
// when the affected rows are what the pre-read predicted (1 per insert, 2
// per update); otherwise a concurrent transaction inserted a key the
// pre-read did not find, the gate decided in the statement, and the rows,
// locked now, are read again.
func (u *upsertEffect) applied(ctx context.Context, t *sql.Tx, write []effect.Keyed, stored map[string]*int64, affected int64, keyArgs [][]any) ([]effect.Keyed, error) {
	if u.seqIdx < 0 {
		return write, nil
	}
	expect := int64(0)
	for _, w := range write {
		if _, ok := stored[w.Key]; ok {
			expect += 2
		} else {
			expect++
		}
	}
	if affected == expect {
		return write, nil
	}
	return u.recount(ctx, t, write, keyArgs)
}

// evaluate computes a record's row and key arguments and its Keyed.
func (u *upsertEffect) evaluate(m *effect.Record, i int, rows, keyArgs [][]any) (effect.Keyed, error) {
	k := effect.Keyed{Index: i}
	row, err := rowArgs(u.cols, m)
	if err != nil {
		return k, err
	}
	if u.seq != nil {
		if k.Seq, err = u.seq(m); err != nil {
			return k, fmt.Errorf("sequence: %w", err)
		}
	}
	parts := make([]string, len(u.keyIdx))
	ka := make([]any, len(u.keyIdx))
	for j, idx := range u.keyIdx {
		col := u.cols[idx]
		if parts[j], err = col.expr.Text(m); err != nil {
			return k, fmt.Errorf("key column %s: %w", col.name, err)
		}
		ka[j] = row[idx]
	}
	k.Key = strings.Join(parts, "\x00")
	rows[i], keyArgs[i] = row, ka
	return k, nil
}

// readStored locks the winners' rows (FOR UPDATE, in key order: record
// locks only, at READ COMMITTED) and returns each stored sequence by key
// (nil: NULL, which any sequence replaces).
func (u *upsertEffect) readStored(ctx context.Context, t *sql.Tx, winners []effect.Keyed, keyArgs [][]any) (map[string]*int64, error) {
	args := make([]any, 0, len(winners)*len(u.keyIdx))
	for _, w := range winners {
		args = append(args, keyArgs[w.Index]...)
	}
	q := u.read + u.inList(len(winners)) + ` FOR UPDATE`
	rows, err := t.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("while reading the stored sequences of %d keys: %w", len(winners), err)
	}
	defer func() { _ = rows.Close() }()
	out := make(map[string]*int64, len(winners))
	parts := make([]sql.NullString, len(u.keyIdx))
	dest := make([]any, 0, len(u.keyIdx)+1)
	for i := range parts {
		dest = append(dest, &parts[i])
	}
	var seq sql.NullInt64
	dest = append(dest, &seq)
	text := make([]string, len(u.keyIdx))
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("while reading the stored sequences: %w", err)
		}
		for i, p := range parts {
			text[i] = p.String
		}
		var cur *int64
		if seq.Valid {
			v := seq.Int64
			cur = &v
		}
		out[strings.Join(text, "\x00")] = cur
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("while reading the stored sequences: %w", err)
	}
	return out, nil
}

// inList is "(?, ?)" for n keys of one column, "((?, ?), (?, ?))" for
// composite keys.
func (u *upsertEffect) inList(n int) string {
	if len(u.keyIdx) == 1 {
		return "(" + strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ")"
	}
	return "(" + placeholders(n, len(u.keyIdx)) + ")"
}

// recount returns the written rows the gate let through: after the upsert
// they are locked, and a row holds its winner's sequence exactly when the
// winner was applied (a concurrent writer's equal sequence reads as applied:
// the same version).
func (u *upsertEffect) recount(ctx context.Context, t *sql.Tx, write []effect.Keyed, keyArgs [][]any) ([]effect.Keyed, error) {
	stored, err := u.readStored(ctx, t, write, keyArgs)
	if err != nil {
		return nil, err
	}
	out := write[:0]
	for _, w := range write {
		if cur, ok := stored[w.Key]; ok && cur != nil && *cur == w.Seq {
			out = append(out, w)
		}
	}
	return out, nil
}
