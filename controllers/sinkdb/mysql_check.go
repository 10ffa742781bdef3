package sinkdb

// MySQL's and MariaDB's preflight: the catalog from information_schema
// (the table, its columns and their types, the unique key an upsert's ON
// DUPLICATE KEY UPDATE needs), then the effect's own statements prepared
// on the server (COM_STMT_PREPARE, never executed), which checks every
// table, column and privilege as the runtime's statements will meet them.
//
// Privileges are the server's own check at prepare rather than a reading
// of information_schema's *_PRIVILEGES tables or SHOW GRANTS: those list
// the grants made to the account itself, not the ones it holds through a
// role (MySQL 8, MariaDB), and a database-level grant there is a LIKE
// pattern; the prepare sees exactly what the runtime will be allowed. The
// message then names the whole GRANT the effect needs
// (mysql.EffectGrant), as PostgreSQL's does.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	gomysql "github.com/go-sql-driver/mysql"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/errtext"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
)

// mysqlDialect is MySQL's and MariaDB's.
type mysqlDialect struct{ db *mysql.DB }

var mySyntax = syntax{
	ident:     mysql.Quote,
	toInteger: func(table, col string) string { return "ALTER TABLE " + table + " MODIFY COLUMN " + col + " BIGINT" },
}

// account is the account the server matched ('user'@'host').
func (d mysqlDialect) account() string { return mysql.AccountSQL(d.db.Account()) }

func (d mysqlDialect) checkEffect(ctx context.Context, cfg *config.Config) error {
	err := d.checkEffectOnce(ctx, cfg)
	var p *EffectProblem
	if errors.As(err, &p) && p.Reason == messagingv1alpha1.ReasonPermissionDenied {
		d.refresh()
	}
	return err
}

// refresh closes the pool's idle connections after a privilege refusal:
// MySQL applies a database-level GRANT to a session only at its next USE,
// so the GRANT a message names would otherwise stay unseen by the pooled
// sessions the next check reuses.
func (d mysqlDialect) refresh() {
	d.db.SQL().SetMaxIdleConns(0)
	d.db.SQL().SetMaxIdleConns(MaxConnsPerDatabase)
}

func (d mysqlDialect) checkEffectOnce(ctx context.Context, cfg *config.Config) error {
	conn, err := d.db.SQL().Conn(ctx)
	if err != nil {
		return fmt.Errorf("while connecting for the effect check: %w", err)
	}
	defer func() { _ = conn.Close() }()
	e, schema := cfg.Sink.Effect, cfg.Sink.Schema
	switch {
	case e.Upsert != nil:
		err = d.checkTable(ctx, conn, cfg, tableEffect{field: "spec.sink.effect.upsert", table: e.Upsert.Table,
			columns: e.Upsert.Columns, key: e.Upsert.Key, sequence: e.Upsert.SequenceColumn})
	case e.Append != nil:
		err = d.checkTable(ctx, conn, cfg, tableEffect{field: "spec.sink.effect.append", table: e.Append.Table, columns: e.Append.Columns})
	case e.SQL != nil:
		return d.checkStatement(ctx, conn, schema, e.SQL)
	}
	if err != nil {
		return err
	}
	return d.prepareEffect(ctx, conn, cfg)
}

// prepared prepares stmt on conn and closes it at once: the number of
// parameters the server reads, or its error.
func prepared(ctx context.Context, conn *sql.Conn, stmt string) (int, error) {
	n := 0
	err := conn.Raw(func(dc any) error {
		p, ok := dc.(driver.ConnPrepareContext)
		if !ok {
			return errors.New("the MySQL driver connection cannot prepare statements")
		}
		st, err := p.PrepareContext(ctx, stmt)
		if err != nil {
			return err
		}
		n = st.NumInput()
		return st.Close()
	})
	return n, err
}

func (d mysqlDialect) checkTable(ctx context.Context, conn *sql.Conn, cfg *config.Config, t tableEffect) error {
	schema := cfg.Sink.Schema
	qualified := mysql.Quote(schema) + "." + mysql.Quote(t.table)
	grant := mysql.EffectGrant(cfg.Sink.Effect, schema, d.db.Account())
	// denied: the table or a column is hidden from the account (err is
	// the server refusing a probe of it).
	denied := func(err error) *EffectProblem {
		return problem(messagingv1alpha1.ReasonPermissionDenied, "account %s holds no privilege on table %s or its mapped columns (MySQL error %d: %s); run %s",
			d.account(), qualified, mysqlErrorNumber(err), serverMessage(err), grant)
	}
	var n int
	err := conn.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?`, schema, t.table).Scan(&n)
	if err != nil {
		return fmt.Errorf("while looking up table %s: %w", qualified, err)
	}
	if n == 0 {
		// information_schema lists only the tables the account holds a
		// privilege on: the server says which it is.
		_, err := prepared(ctx, conn, "SELECT 1 FROM "+qualified)
		switch num := mysqlErrorNumber(err); {
		case num == 1146 || num == 1049:
			return problem(messagingv1alpha1.ReasonTableNotFound,
				"table %s (%s.table) does not exist in the sink database; create it, e.g. CREATE TABLE %s (%s), or run the service's migration",
				qualified, t.field, qualified, suggestedColumns(mySyntax, t))
		case isPrivilegeNumber(num):
			return denied(err)
		case err != nil:
			return fmt.Errorf("while looking up table %s: %w", qualified, err)
		}
	}
	cols, generated, err := mysqlColumns(ctx, conn, schema, t.table)
	if err != nil {
		return fmt.Errorf("while reading the columns of %s: %w", qualified, err)
	}
	var hidden []string
	for _, name := range sortedNames(t.columns) {
		if _, ok := cols[name]; !ok {
			hidden = append(hidden, name)
		}
	}
	if len(hidden) > 0 {
		// Not listed: missing, or the account holds no privilege on it.
		if _, err := prepared(ctx, conn, "SELECT "+mySyntax.list(hidden)+" FROM "+qualified); isPrivilegeNumber(mysqlErrorNumber(err)) {
			return denied(err)
		}
	}
	if p := checkColumns(mySyntax, qualified, t, cols); p != nil {
		return p
	}
	for _, name := range sortedNames(t.columns) {
		if generated[name] {
			return problem(messagingv1alpha1.ReasonStatementInvalid,
				"column %s of table %s (%s.columns.%s) is generated, so the %s into it cannot run; remove it from the mapping, or make it a stored column (ALTER TABLE %s MODIFY COLUMN %s <type>)",
				mysql.Quote(name), qualified, t.field, name, cfg.Sink.Effect.Kind(), qualified, mysql.Quote(name))
		}
	}
	if t.upsert() {
		ok, err := mysqlUniqueKey(ctx, conn, schema, t.table, t.key)
		if err != nil {
			return fmt.Errorf("while reading the unique keys of %s: %w", qualified, err)
		}
		if !ok {
			return problem(messagingv1alpha1.ReasonNoUniqueKey,
				"no primary key or unique key of %s covers exactly the upsert key (%s) (%s.key), which ON DUPLICATE KEY UPDATE needs; run ALTER TABLE %s ADD UNIQUE KEY (%s)",
				qualified, mySyntax.list(t.key), t.field, qualified, mySyntax.list(t.key))
		}
	}
	return nil
}

// mysqlColumns reads the table's columns (those information_schema shows
// the account) and which of them are generated.
func mysqlColumns(ctx context.Context, conn *sql.Conn, schema, table string) (map[string]sinkColumn, map[string]bool, error) {
	rows, err := conn.QueryContext(ctx, `SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT IS NULL, EXTRA
		FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?`, schema, table)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = rows.Close() }()
	cols, generated := map[string]sinkColumn{}, map[string]bool{}
	for rows.Next() {
		var name, dataType, colType, nullable, extra string
		var noDefault bool
		if err := rows.Scan(&name, &dataType, &colType, &nullable, &noDefault, &extra); err != nil {
			return nil, nil, err
		}
		extra = strings.ToUpper(extra)
		gen := strings.Contains(extra, "GENERATED") || strings.Contains(extra, "VIRTUAL") || strings.Contains(extra, "PERSISTENT")
		c := sinkColumn{typ: colType, category: mysqlCategory(strings.ToLower(dataType))}
		c.required = nullable == "NO" && noDefault && !strings.Contains(extra, "AUTO_INCREMENT") && !gen
		c.integer = c.category == "N" && strings.HasSuffix(strings.ToLower(dataType), "int")
		c.json = strings.EqualFold(dataType, "json")
		cols[name], generated[name] = c, gen
	}
	return cols, generated, rows.Err()
}

// mysqlCategory puts a DATA_TYPE in PostgreSQL's type categories, which
// assignable reads: N numeric, S string (binary strings and BLOBs too:
// they take the text as bytes), D date and time, U the rest (JSON,
// spatial).
func mysqlCategory(dataType string) string {
	switch dataType {
	case "tinyint", "smallint", "mediumint", "int", "bigint", "decimal", "float", "double", "bit":
		return "N"
	case "char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set",
		"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob":
		return "S"
	case "date", "datetime", "timestamp", "time", "year":
		return "D"
	}
	return "U"
}

// mysqlUniqueKey: ON DUPLICATE KEY UPDATE fires on a duplicate of a
// primary or unique key; one over exactly the key columns, whole (no
// prefix length, no expression), makes the key identify the row.
func mysqlUniqueKey(ctx context.Context, conn *sql.Conn, schema, table string, key []string) (bool, error) {
	rows, err := conn.QueryContext(ctx, `SELECT INDEX_NAME, COLUMN_NAME, SUB_PART IS NOT NULL
		FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND NON_UNIQUE = 0`, schema, table)
	if err != nil {
		return false, err
	}
	defer func() { _ = rows.Close() }()
	indexes, partial := map[string][]string{}, map[string]bool{}
	for rows.Next() {
		var index string
		var column sql.NullString
		var prefix bool
		if err := rows.Scan(&index, &column, &prefix); err != nil {
			return false, err
		}
		indexes[index] = append(indexes[index], column.String)
		partial[index] = partial[index] || prefix || !column.Valid
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	want := slices.Clone(key)
	sort.Strings(want)
	for index, cols := range indexes {
		sort.Strings(cols)
		if !partial[index] && slices.Equal(cols, want) {
			return true, nil
		}
	}
	return false, nil
}

// prepareEffect prepares the statements the runtime runs for the upsert or
// append (mysql.Statements): what the catalog checks leave to the server,
// the privileges first among them.
func (d mysqlDialect) prepareEffect(ctx context.Context, conn *sql.Conn, cfg *config.Config) error {
	eff, err := d.db.Effect(cfg.Sink.Effect, cfg.Sink.Schema, cfg.Message.Entity)
	if err != nil {
		return fmt.Errorf("while building the effect to check it: %w", err)
	}
	stmts, err := mysql.Statements(eff)
	if err != nil {
		return err
	}
	kind, table := cfg.Sink.Effect.Kind(), mysql.Quote(cfg.Sink.Schema)+"."+mysql.Quote(effectTable(cfg))
	for _, stmt := range stmts {
		_, err := prepared(ctx, conn, stmt)
		if err == nil {
			continue
		}
		num := mysqlErrorNumber(err)
		switch {
		case num == 0:
			return fmt.Errorf("while checking the %s statement: %w", kind, err)
		case isPrivilegeNumber(num):
			return problem(messagingv1alpha1.ReasonPermissionDenied, "account %s may not run the %s into %s (MySQL error %d: %s); run %s",
				d.account(), kind, table, num, serverMessage(err), mysql.EffectGrant(cfg.Sink.Effect, cfg.Sink.Schema, d.db.Account()))
		}
		return problem(messagingv1alpha1.ReasonStatementInvalid, "the %s into %s cannot run: %s (MySQL error %d); fix the table or spec.sink.effect.%s",
			kind, table, serverMessage(err), num, kind)
	}
	return nil
}

// checkStatement prepares the sql effect's statement (its :name
// parameters converted as the runtime converts them), checks that the
// server reads one parameter per use, and closes it: a syntax error, a
// second statement, a missing table or column or a privilege the account
// lacks is refused there.
func (d mysqlDialect) checkStatement(ctx context.Context, conn *sql.Conn, schema string, s *config.SQL) error {
	stmt, names, err := effect.ConvertNamedParamsMySQL(s.Statement)
	if err != nil {
		return problem(messagingv1alpha1.ReasonStatementInvalid, "spec.sink.effect.sql.statement cannot be read: %v", err)
	}
	n, err := prepared(ctx, conn, stmt)
	if err != nil {
		num := mysqlErrorNumber(err)
		if num == 0 {
			return fmt.Errorf("while checking spec.sink.effect.sql.statement: %w", err)
		}
		reason, hint := messagingv1alpha1.ReasonStatementInvalid, "fix the statement"
		switch {
		case isPrivilegeNumber(num):
			reason, hint = messagingv1alpha1.ReasonPermissionDenied, "GRANT the privilege it names to the account"
			if g := mysql.Advice(err, schema, d.db.Account()); g != "" {
				hint = "run " + g
			}
		case num == 1146:
			reason, hint = messagingv1alpha1.ReasonTableNotFound, "create the table (run the service's migration) or fix the statement"
		case num == 1054:
			reason, hint = messagingv1alpha1.ReasonColumnNotFound, "add the column or fix the statement"
		case num == 1064 && strings.Contains(stmt, ";"):
			hint = "keep one statement (MySQL prepares one at a time)"
		}
		return problem(reason, "spec.sink.effect.sql.statement does not prepare: %s (MySQL error %d); %s", serverMessage(err), num, hint)
	}
	if n != len(names) {
		return problem(messagingv1alpha1.ReasonStatementInvalid,
			"spec.sink.effect.sql.statement declares %d parameters (%s) but MySQL reads %d; use only :name parameters",
			len(names), paramList(names), n)
	}
	return nil
}

func (d mysqlDialect) explainMigrate(_ context.Context, schema string, err error) error {
	num := mysqlErrorNumber(err)
	if !isPrivilegeNumber(num) {
		return err
	}
	d.refresh()
	return problem(messagingv1alpha1.ReasonPermissionDenied,
		"account %s may not migrate the inbox in database %s (MySQL error %d: %s); run %s",
		d.account(), mysql.Quote(schema), num, serverMessage(err), strings.Join(mysql.ControllerGrants(schema, d.db.Account()), "; "))
}

// explain names the GRANT a privilege refusal lacks (mysql.PrivilegeError).
func (d mysqlDialect) explain(err error, schema string) error {
	if isPrivilegeNumber(mysqlErrorNumber(err)) {
		d.refresh()
	}
	return d.db.WithAdvice(err, schema)
}

func isPrivilegeNumber(n uint16) bool { return n == 1044 || n == 1142 || n == 1143 || n == 1227 }

// serverMessage is the server's own message of err, sanitized.
func serverMessage(err error) string {
	var me *gomysql.MySQLError
	if errors.As(err, &me) {
		return errtext.Sanitize(me.Message)
	}
	return errtext.Of(err)
}
