package mysql

import (
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// Least privilege (docs/mysql.md, "Least-privilege grants"). Two accounts:
//
//   - the controller's (MigrateFor, Check, MarkRestored, DropOwned, and
//     PhysicalDatabase, which mints the database's identity row once): it
//     creates, alters and drops the inbox's tables, so it holds CREATE,
//     ALTER, DROP, INDEX and the data privileges on the database
//     (ControllerGrants);
//   - the runtime's (the consumer loop, prune, Verify, progress, the
//     stored window): data privileges on the inbox's own tables only, and
//     for the Partitioned layout the partition DDL on the inbox table
//     (ALTER for REORGANIZE PARTITION, DROP for DROP PARTITION) and LOCK
//     TABLES on the database (PrunePartitions locks the inbox around its
//     check-and-drop) (RuntimeGrants). GET_LOCK and information_schema
//     (which shows an account the tables it holds a privilege on) need
//     nothing more. The effect's own tables (upsert, append) are the
//     user's: the runtime needs SELECT, INSERT, UPDATE on them (upsert) or
//     INSERT (append), granted by whoever owns them.
//
// The conformance suite runs the runtime under exactly RuntimeGrants
// (runtime/sink/sinktest, LeastPrivilege). The outbox and redrive tables
// (not on MySQL yet) are not listed.

// RuntimeGrants are the GRANT statements the runtime's account needs on
// the inbox n in layout; account is "user@host".
func RuntimeGrants(n inbox.Names, layout config.Layout, account string) []string {
	to := " TO " + accountSQL(account)
	on := func(privs, table string) string { return "GRANT " + privs + " ON " + qualify(n.Schema, table) + to }
	inboxPrivs := "SELECT, INSERT, UPDATE, DELETE"
	out := []string{}
	if layout == config.LayoutPartitioned {
		inboxPrivs += ", ALTER, DROP"
		out = append(out, on("SELECT, INSERT, UPDATE", claimLocksName(n)), grantOn("LOCK TABLES", n.Schema, account))
	}
	return append(out,
		on(inboxPrivs, n.Inbox),
		on("SELECT, INSERT, UPDATE, DELETE", n.DeadLetters),
		on("SELECT, INSERT, UPDATE", n.PruneRuns),
		on("SELECT, INSERT", n.IDConflicts),
		on("SELECT, INSERT, UPDATE, DELETE", n.Progress),
		on("SELECT, INSERT, UPDATE", n.Window),
		// SELECT … FOR UPDATE on the meta row serializes window updates;
		// MySQL 8.0.22+ wants UPDATE (or LOCK TABLES) beside SELECT for a
		// locking read, MariaDB SELECT alone.
		on("SELECT, UPDATE", n.Meta),
	)
}

// ControllerGrants is the GRANT the controller's account needs on the
// database that holds its inboxes.
func ControllerGrants(database, account string) []string {
	return []string{grantOn("SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX, LOCK TABLES", database, account)}
}
