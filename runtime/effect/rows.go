package effect

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
)

// rowBuilder turns records into one JSON array of row objects. PostgreSQL
// reads it with jsonb_populate_recordset(NULL::table, $1), which casts each
// JSON value to its column's type: the whole batch is one parameter.
type rowBuilder struct {
	cols []column
	keys [][]byte // JSON-quoted column names
}

func newRowBuilder(cols map[string]string) (rowBuilder, error) {
	cc, err := compileColumns(cols)
	if err != nil {
		return rowBuilder{}, err
	}
	b := rowBuilder{cols: cc}
	for _, c := range cc {
		k, _ := json.Marshal(c.name) // marshalling a string cannot fail
		b.keys = append(b.keys, k)
	}
	return b, nil
}

// arena holds the rows of one batch in one growing buffer, so a batch costs
// a few allocations instead of one buffer per row. A row returned earlier
// stays valid when the buffer grows (it keeps the old backing array).
type arena struct{ buf []byte }

// newArena sizes the buffer for rows about as large as the payloads they
// come from, so it does not grow (and copy) by doubling through a batch. The
// estimate stops at arenaEstimateMax: columns picked from large payloads
// would otherwise reserve far more than the rows take.
func newArena(recs []*Record) arena {
	n := 0
	for _, m := range recs {
		n += len(m.Body) + 2
	}
	return arena{buf: make([]byte, 0, min(n, arenaEstimateMax))}
}

// arenaEstimateMax caps newArena's estimate; a larger batch grows past it.
const arenaEstimateMax = 1 << 20

// row appends one record as a JSON object and returns it.
func (a *arena) row(b rowBuilder, m *Record) ([]byte, error) {
	start := len(a.buf)
	a.buf = append(a.buf, '{')
	for i, c := range b.cols {
		if i > 0 {
			a.buf = append(a.buf, ',')
		}
		a.buf = append(a.buf, b.keys[i]...)
		a.buf = append(a.buf, ':')
		var err error
		if a.buf, err = c.expr.AppendJSON(a.buf, m); err != nil {
			a.buf = a.buf[:start]
			return nil, fmt.Errorf("column %s: %w", c.name, err)
		}
	}
	a.buf = append(a.buf, '}')
	return a.buf[start:len(a.buf):len(a.buf)], nil
}

// jsonArray joins rows into one JSON array with a single allocation.
func jsonArray(rows [][]byte) []byte {
	n := 2 + len(rows)
	for _, r := range rows {
		n += len(r)
	}
	out := make([]byte, 0, n)
	out = append(out, '[')
	for i, r := range rows {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, r...)
	}
	return append(out, ']')
}

func (b rowBuilder) columnList() string {
	names := make([]string, len(b.cols))
	for i, c := range b.cols {
		names[i] = ident(c.name)
	}
	return strings.Join(names, ", ")
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// appendEffect inserts one row per new message.
type appendEffect struct {
	rows rowBuilder
	stmt string
}

func newAppend(cfg *config.Append, schema string) (*appendEffect, error) {
	rb, err := newRowBuilder(cfg.Columns)
	if err != nil {
		return nil, fmt.Errorf("while building the append effect: %w", err)
	}
	table := pgx.Identifier{schema, cfg.Table}.Sanitize()
	cols := rb.columnList()
	return &appendEffect{rows: rb, stmt: `INSERT INTO ` + table + ` (` + cols + `) SELECT ` + cols +
		` FROM jsonb_populate_recordset(NULL::` + table + `, $1::jsonb)`}, nil
}

func (a *appendEffect) Transactional() bool { return true }

func (a *appendEffect) Apply(ctx context.Context, tx pgx.Tx, recs []*Record) (Result, error) {
	var res Result
	rows := make([][]byte, 0, len(recs))
	buf := newArena(recs)
	for i, m := range recs {
		r, err := buf.row(a.rows, m)
		if err != nil {
			res.Failed = append(res.Failed, Failure{Index: i, Err: err})
			continue
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return res, nil
	}
	tag, err := tx.Exec(ctx, a.stmt, jsonArray(rows))
	if err != nil {
		return res, fmt.Errorf("while appending %d rows: %w", len(rows), err)
	}
	res.Applied = int(tag.RowsAffected())
	return res, nil
}

// upsertEffect writes the latest state per key behind the sequence gate.
type upsertEffect struct {
	rows   rowBuilder
	keyIdx []int
	// seq orders records of one key: the sequence column's value, else the
	// entity sequence, else nil (arrival order: the last one wins).
	seq  func(*Record) (int64, error)
	stmt string
	// changes, when set (TrackChanges), replaces stmt and fills
	// Result.Changed.
	changes string
	track   bool
}

func newUpsert(cfg *config.Upsert, schema string, entity *config.Entity) (*upsertEffect, error) {
	rb, err := newRowBuilder(cfg.Columns)
	if err != nil {
		return nil, fmt.Errorf("while building the upsert effect: %w", err)
	}
	u := &upsertEffect{rows: rb}
	for _, k := range cfg.Key {
		i := slices.IndexFunc(rb.cols, func(c column) bool { return c.name == k })
		if i < 0 {
			return nil, fmt.Errorf("while building the upsert effect: key column %q is not among columns", k)
		}
		u.keyIdx = append(u.keyIdx, i)
	}
	if err := u.setSequence(cfg, entity); err != nil {
		return nil, err
	}
	table := pgx.Identifier{schema, cfg.Table}.Sanitize()
	u.stmt = upsertStatement(rb, table, cfg.Key, cfg.SequenceColumn)
	u.changes = changesStatement(rb, table, cfg.Key, cfg.SequenceColumn)
	return u, nil
}

func (u *upsertEffect) setSequence(cfg *config.Upsert, entity *config.Entity) error {
	switch {
	case cfg.SequenceColumn != "":
		i := slices.IndexFunc(u.rows.cols, func(c column) bool { return c.name == cfg.SequenceColumn })
		if i < 0 {
			return fmt.Errorf("while building the upsert effect: sequence column %q is not among columns", cfg.SequenceColumn)
		}
		expr := u.rows.cols[i].expr
		u.seq = func(m *Record) (int64, error) { return expr.Int(m) }
	case entity != nil:
		x, err := extract.CompileExtractor(entity.Sequence)
		if err != nil {
			return fmt.Errorf("while building the upsert effect: entity sequence: %w", err)
		}
		u.seq = x.Int
	}
	return nil
}

func upsertStatement(rb rowBuilder, table string, key []string, seqCol string) string {
	return upsertInsert(rb, table, `jsonb_populate_recordset(NULL::`+table+`, $1::jsonb)`, key, seqCol) + ` RETURNING 1`
}

// changesStatement is the upsert that also reports which rows it wrote: it
// returns the 1-based positions (in the batch array) of the rows the gate
// let through (inserted or updated). Used for emit.when: Changed.
func changesStatement(rb rowBuilder, table string, key []string, seqCol string) string {
	keys := make([]string, len(key))
	for i, k := range key {
		keys[i] = ident(k)
	}
	keyList := strings.Join(keys, ", ")
	return `WITH src AS (SELECT * FROM jsonb_populate_recordset(NULL::` + table + `, $1::jsonb) WITH ORDINALITY), ` +
		`up AS (` + upsertInsert(rb, table, `src`, key, seqCol) + ` RETURNING ` + keyList + `) ` +
		`SELECT src.ordinality FROM src JOIN up USING (` + keyList + `)`
}

func upsertInsert(rb rowBuilder, table, from string, key []string, seqCol string) string {
	cols := rb.columnList()
	keys := make([]string, len(key))
	for i, k := range key {
		keys[i] = ident(k)
	}
	var sets []string
	for _, c := range rb.cols {
		if !slices.Contains(key, c.name) {
			sets = append(sets, ident(c.name)+" = EXCLUDED."+ident(c.name))
		}
	}
	stmt := `INSERT INTO ` + table + ` AS cur (` + cols + `) SELECT ` + cols +
		` FROM ` + from + ` ON CONFLICT (` + strings.Join(keys, ", ") + `) `
	if len(sets) == 0 {
		return stmt + `DO NOTHING`
	}
	stmt += `DO UPDATE SET ` + strings.Join(sets, ", ")
	if seqCol != "" {
		// The gate: an older or equal sequence never overwrites newer state.
		// A stored NULL is unknown state and may be replaced.
		s := ident(seqCol)
		stmt += ` WHERE cur.` + s + ` IS NULL OR cur.` + s + ` < EXCLUDED.` + s
	}
	return stmt
}

func (u *upsertEffect) Transactional() bool { return true }

// candidate is the record currently winning for one key.
type candidate struct {
	row   []byte
	seq   int64
	index int // into the recs of Apply
}

func (u *upsertEffect) Apply(ctx context.Context, tx pgx.Tx, recs []*Record) (Result, error) {
	var res Result
	winners := make(map[string]candidate, len(recs))
	order := make([]string, 0, len(recs)) // keys, sorted below
	valid := 0
	buf := newArena(recs)
	for i, m := range recs {
		key, c, err := u.evaluate(&buf, m)
		c.index = i
		if err != nil {
			res.Failed = append(res.Failed, Failure{Index: i, Err: err})
			continue
		}
		valid++
		prev, seen := winners[key]
		if !seen {
			order = append(order, key)
		}
		// Without a sequence the later record wins; with one, the higher
		// sequence wins and a tie keeps the earlier record.
		if !seen || u.seq == nil || c.seq > prev.seq {
			winners[key] = c
		}
	}
	if len(winners) == 0 {
		return res, nil
	}
	// Every transaction writes its keys in the same (sorted) order, so two
	// replicas upserting overlapping keys cannot deadlock on each other.
	sort.Strings(order)
	rows := make([][]byte, len(order))
	for i, k := range order {
		rows[i] = winners[k].row
	}
	if u.track {
		return u.applyTracked(ctx, tx, order, winners, rows, valid, res)
	}
	tag, err := tx.Exec(ctx, u.stmt, jsonArray(rows))
	if err != nil {
		return res, fmt.Errorf("while upserting %d rows: %w", len(rows), err)
	}
	res.Applied = int(tag.RowsAffected())
	res.Stale = valid - res.Applied
	return res, nil
}

// applyTracked runs the changes statement and lists the records it wrote.
func (u *upsertEffect) applyTracked(ctx context.Context, tx pgx.Tx, order []string, winners map[string]candidate, rows [][]byte, valid int, res Result) (Result, error) {
	out, err := tx.Query(ctx, u.changes, jsonArray(rows))
	if err != nil {
		return res, fmt.Errorf("while upserting %d rows: %w", len(rows), err)
	}
	positions, err := pgx.CollectRows(out, pgx.RowTo[int64])
	if err != nil {
		return res, fmt.Errorf("while upserting %d rows: %w", len(rows), err)
	}
	for _, p := range positions {
		res.Changed = append(res.Changed, winners[order[p-1]].index)
	}
	sort.Ints(res.Changed)
	res.Applied = len(positions)
	res.Stale = valid - res.Applied
	return res, nil
}

func (u *upsertEffect) evaluate(buf *arena, m *Record) (string, candidate, error) {
	var c candidate
	var err error
	if c.row, err = buf.row(u.rows, m); err != nil {
		return "", c, err
	}
	if u.seq != nil {
		if c.seq, err = u.seq(m); err != nil {
			return "", c, fmt.Errorf("sequence: %w", err)
		}
	}
	if len(u.keyIdx) == 1 {
		col := u.rows.cols[u.keyIdx[0]]
		key, err := col.expr.Text(m)
		if err != nil {
			return "", c, fmt.Errorf("key column %s: %w", col.name, err)
		}
		return key, c, nil
	}
	parts := make([]string, len(u.keyIdx))
	for i, k := range u.keyIdx {
		col := u.rows.cols[k]
		if parts[i], err = col.expr.Text(m); err != nil {
			return "", c, fmt.Errorf("key column %s: %w", col.name, err)
		}
	}
	// NUL cannot occur in PostgreSQL text, so it separates key parts safely.
	return strings.Join(parts, "\x00"), c, nil
}
