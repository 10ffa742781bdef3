package mysql

import (
	"fmt"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// Statements are the statements e runs for a batch of one record, with ?
// placeholders, in the order it runs them: the upsert's locking pre-read
// (with a sequence column) and its INSERT … ON DUPLICATE KEY UPDATE, the
// append's INSERT, the sql effect's statement. The controller's preflight
// prepares them (COM_STMT_PREPARE: never executed), so the server checks
// the tables, columns and privileges exactly as it will when the runtime
// runs them.
func Statements(e sink.Effect) ([]string, error) {
	switch e := e.(type) {
	case *upsertEffect:
		var out []string
		if e.read != "" {
			out = append(out, e.read+e.inList(1)+` FOR UPDATE`)
		}
		return append(out, e.insert+placeholders(1, len(e.cols))+e.tail), nil
	case *appendEffect:
		return []string{`INSERT INTO ` + e.table + ` (` + e.list + `) VALUES ` + placeholders(1, len(e.cols))}, nil
	case *sqlEffect:
		return []string{e.stmt}, nil
	}
	return nil, fmt.Errorf("the effect %T is not a MySQL effect", e)
}

// EffectGrant is the GRANT that gives account ("user@host") what the
// runtime needs on an upsert's or append's table: SELECT, INSERT, UPDATE
// for an upsert, with or without a sequence column (… ON DUPLICATE KEY
// UPDATE c = VALUES(c) reads c: MariaDB refuses it without SELECT on the
// column), INSERT for an append; "" for an sql effect (its statement
// names its own tables: Advice names the one refused).
func EffectGrant(e config.Effect, database, account string) string {
	var privs, table string
	switch {
	case e.Upsert != nil:
		privs, table = "SELECT, INSERT, UPDATE", e.Upsert.Table
	case e.Append != nil:
		privs, table = "INSERT", e.Append.Table
	default:
		return ""
	}
	return "GRANT " + privs + " ON " + qualify(database, table) + " TO " + accountSQL(account)
}

// Quote quotes a validated identifier with backticks.
func Quote(name string) string { return quote(name) }

// AccountSQL quotes "user@host" (CURRENT_USER()) as 'user'@'host'.
func AccountSQL(account string) string { return accountSQL(account) }
