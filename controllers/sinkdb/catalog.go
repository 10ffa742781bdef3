package sinkdb

// The catalog checks of an upsert or append effect: the table, its
// columns, the unique key an upsert's ON CONFLICT needs, and the role's
// privileges, each failing with the reason and what to run.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// tableEffect is an upsert (key set) or an append.
type tableEffect struct {
	field    string
	table    string
	columns  map[string]string
	key      []string
	sequence string
}

func (t tableEffect) upsert() bool { return len(t.key) > 0 }

// sinkColumn is a column of the target table as the catalog describes it.
type sinkColumn struct {
	typ      string // format_type, e.g. "bigint", "timestamp with time zone"; MySQL's COLUMN_TYPE
	category string // pg_type.typcategory: N numeric, S string, D date/time, B boolean, U user (json, uuid...)
	required bool   // NOT NULL, no default, not identity or generated
	integer  bool   // an integer type (a sequence column must be one)
	json     bool   // json or jsonb (MySQL: JSON)
}

// syntax is how a dialect's messages spell an identifier and the DDL they
// suggest.
type syntax struct {
	ident func(string) string
	// toInteger is the statement that makes column col of table an
	// integer.
	toInteger func(table, col string) string
}

var pgSyntax = syntax{
	ident: func(n string) string { return pgx.Identifier{n}.Sanitize() },
	toInteger: func(table, col string) string {
		return "ALTER TABLE " + table + " ALTER COLUMN " + col + " TYPE bigint USING " + col + "::bigint"
	},
}

func (s syntax) list(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = s.ident(n)
	}
	return strings.Join(out, ", ")
}

func checkTableEffect(ctx context.Context, tx pgx.Tx, schema string, t tableEffect) error {
	qualified := pgx.Identifier{schema, t.table}.Sanitize()
	var relID uint32
	var hasUsage bool
	err := tx.QueryRow(ctx, `SELECT c.oid, has_schema_privilege(n.oid, 'USAGE')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p', 'v', 'f')`, schema, t.table).Scan(&relID, &hasUsage)
	if errors.Is(err, pgx.ErrNoRows) {
		return problem(messagingv1alpha1.ReasonTableNotFound,
			"table %s (%s.table) does not exist in the sink database; create it, e.g. CREATE TABLE %s (%s), or run the service's migration",
			qualified, t.field, qualified, suggestedColumns(pgSyntax, t))
	}
	if err != nil {
		return fmt.Errorf("while looking up table %s: %w", qualified, err)
	}
	if !hasUsage {
		return problem(messagingv1alpha1.ReasonPermissionDenied,
			"the sink role has no USAGE on schema %s; run GRANT USAGE ON SCHEMA %s TO <role>",
			pgx.Identifier{schema}.Sanitize(), pgx.Identifier{schema}.Sanitize())
	}
	cols, err := tableColumns(ctx, tx, relID)
	if err != nil {
		return fmt.Errorf("while reading the columns of %s: %w", qualified, err)
	}
	if p := checkColumns(pgSyntax, qualified, t, cols); p != nil {
		return p
	}
	if t.upsert() {
		ok, err := hasUniqueKey(ctx, tx, relID, t.key)
		if err != nil {
			return fmt.Errorf("while reading the unique indexes of %s: %w", qualified, err)
		}
		if !ok {
			return problem(messagingv1alpha1.ReasonNoUniqueKey,
				"no primary key or unique index of %s covers exactly the upsert key (%s) (%s.key), which ON CONFLICT needs; run CREATE UNIQUE INDEX ON %s (%s)",
				qualified, pgSyntax.list(t.key), t.field, qualified, pgSyntax.list(t.key))
		}
	}
	return checkPrivileges(ctx, tx, relID, qualified, t)
}

func suggestedColumns(syn syntax, t tableEffect) string {
	names := sortedNames(t.columns)
	parts := make([]string, 0, len(names)+1)
	for _, n := range names {
		typ := "<type>"
		if n == t.sequence {
			typ = "bigint"
		}
		parts = append(parts, syn.ident(n)+" "+typ)
	}
	if t.upsert() {
		parts = append(parts, "PRIMARY KEY ("+syn.list(t.key)+")")
	}
	return strings.Join(parts, ", ")
}

func tableColumns(ctx context.Context, tx pgx.Tx, relID uint32) (map[string]sinkColumn, error) {
	rows, err := tx.Query(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typcategory::text,
			a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = ''
		FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped`, relID)
	if err != nil {
		return nil, err
	}
	cols := map[string]sinkColumn{}
	for rows.Next() {
		var name string
		var c sinkColumn
		if err := rows.Scan(&name, &c.typ, &c.category, &c.required); err != nil {
			return nil, err
		}
		c.integer, c.json = isIntegerType(c.typ), isJSONType(c.typ)
		cols[name] = c
	}
	return cols, rows.Err()
}

// checkColumns: every mapped column exists and can take its value
// expression, the sequence column is an integer, and no NOT NULL column
// without a default is left unmapped (every insert would fail on it).
func checkColumns(syn syntax, qualified string, t tableEffect, cols map[string]sinkColumn) *EffectProblem {
	for _, name := range sortedNames(t.columns) {
		col, ok := cols[name]
		if !ok {
			return problem(messagingv1alpha1.ReasonColumnNotFound,
				"column %s of table %s (%s.columns.%s) does not exist; run ALTER TABLE %s ADD COLUMN %s <type>, or remove it from the mapping",
				syn.ident(name), qualified, t.field, name, qualified, syn.ident(name))
		}
		if want, ok := assignable(t.columns[name], col); !ok {
			return problem(messagingv1alpha1.ReasonColumnTypeMismatch,
				"column %s of table %s is %s, but its value %s (%s.columns.%s) is %s; change the column type or map another value",
				syn.ident(name), qualified, col.typ, t.columns[name], t.field, name, want)
		}
	}
	if t.sequence != "" && !cols[t.sequence].integer {
		return problem(messagingv1alpha1.ReasonColumnTypeMismatch,
			"the sequence column %s of table %s (%s.sequenceColumn) is %s, but the sequence gate needs an integer type; run %s",
			syn.ident(t.sequence), qualified, t.field, cols[t.sequence].typ, syn.toInteger(qualified, syn.ident(t.sequence)))
	}
	names := make([]string, 0, len(cols))
	for name := range cols {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if _, mapped := t.columns[name]; !mapped && cols[name].required {
			return problem(messagingv1alpha1.ReasonColumnNotFound,
				"column %s of table %s is NOT NULL without a default and not in %s.columns, so every insert would fail; map it, or run ALTER TABLE %s ALTER COLUMN %s SET DEFAULT <value>",
				syn.ident(name), qualified, t.field, qualified, syn.ident(name))
		}
	}
	return nil
}

func isIntegerType(typ string) bool {
	return typ == "smallint" || typ == "integer" || typ == "bigint"
}

// assignable reports whether a value expression can ever fit the column,
// and if not, what kind of value it is. JSON paths and text values (the id,
// a header) are parsed by the column type's input function, so only the
// value decides: those are always accepted here and a bad value
// dead-letters its message. The fixed-shape values are checked.
func assignable(expr string, col sinkColumn) (string, bool) {
	switch expr {
	case "@publishedAt":
		// A timestamp: a date/time, text or JSON column takes it.
		return "a timestamp", col.category == "D" || col.category == "S" || col.json
	case "@payload":
		return "the JSON payload", col.category == "S" || col.json
	}
	return "", true
}

func isJSONType(typ string) bool { return typ == "json" || typ == "jsonb" }

// hasUniqueKey: ON CONFLICT (key) infers a non-partial, non-deferrable
// unique index (or primary key) on exactly the key columns.
func hasUniqueKey(ctx context.Context, tx pgx.Tx, relID uint32, key []string) (bool, error) {
	want := slices.Clone(key)
	sort.Strings(want)
	rows, err := tx.Query(ctx, `SELECT array_agg(a.attname::text ORDER BY a.attname)
		FROM pg_index i
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
		WHERE i.indrelid = $1 AND i.indisunique AND i.indimmediate AND i.indisvalid
		  AND i.indpred IS NULL AND i.indexprs IS NULL
		GROUP BY i.indexrelid`, relID)
	if err != nil {
		return false, err
	}
	found := false
	for rows.Next() {
		var cols []string
		if err := rows.Scan(&cols); err != nil {
			return false, err
		}
		found = found || slices.Equal(cols, want)
	}
	return found, rows.Err()
}

// checkPrivileges: INSERT on every mapped column; for an upsert also UPDATE
// on the columns it sets and SELECT on the sequence column its gate reads.
func checkPrivileges(ctx context.Context, tx pgx.Tx, relID uint32, qualified string, t tableEffect) error {
	type need struct{ column, privilege string }
	var needs []need
	for _, name := range sortedNames(t.columns) {
		needs = append(needs, need{name, "INSERT"})
		if t.upsert() && !slices.Contains(t.key, name) {
			needs = append(needs, need{name, "UPDATE"})
		}
	}
	if t.sequence != "" {
		needs = append(needs, need{t.sequence, "SELECT"})
	}
	// One round trip for all of them (a query each took 7 round trips for
	// an upsert of three columns): the role, and the position of the first
	// need it lacks, in the order above (NULL when it lacks none).
	columns, privileges := make([]string, len(needs)), make([]string, len(needs))
	for i, n := range needs {
		columns[i], privileges[i] = n.column, n.privilege
	}
	var role string
	var missing *int64
	if err := tx.QueryRow(ctx, `SELECT current_user,
			(SELECT min(n.ord) FROM unnest($2::text[], $3::text[]) WITH ORDINALITY AS n(col, priv, ord)
			 WHERE NOT has_column_privilege($1::oid, n.col, n.priv))`, relID, columns, privileges).Scan(&role, &missing); err != nil {
		return fmt.Errorf("while checking the column privileges on %s: %w", qualified, err)
	}
	if missing != nil {
		n := needs[*missing-1]
		grant := "INSERT"
		if t.upsert() {
			grant = "INSERT, UPDATE"
			if t.sequence != "" {
				grant = "SELECT, INSERT, UPDATE"
			}
		}
		return problem(messagingv1alpha1.ReasonPermissionDenied,
			"role %s lacks %s on column %s of table %s; run GRANT %s ON %s TO %s",
			pgx.Identifier{role}.Sanitize(), n.privilege, pgx.Identifier{n.column}.Sanitize(), qualified,
			grant, qualified, pgx.Identifier{role}.Sanitize())
	}
	return nil
}
