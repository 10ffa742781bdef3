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
// The optional tables, for an inbox that uses them (the same inbox.Options
// the runtime opens it with: WithOutbox for spec.emit or http delivery:
// Outbox, WithRedrives for a redrive run):
//
//   - <inbox>_outbox: SELECT, INSERT, UPDATE, DELETE. WriteOutbox and
//     RequeueOutbox are INSERT … ON DUPLICATE KEY UPDATE (INSERT, UPDATE);
//     the relay locks its events (SELECT … FOR UPDATE SKIP LOCKED),
//     MarkOutboxSent and NoteOutboxFailure update them (UPDATE, and SELECT
//     for the WHERE and the attempts read back); DeadLetterOutbox and
//     PruneOutbox delete (DELETE);
//   - <outbox>_shards: SELECT, UPDATE. ClaimOutboxShard locks a shard's
//     row (SELECT … FOR UPDATE SKIP LOCKED: MariaDB wants SELECT, MySQL
//     8.0.22+ UPDATE beside it); its rows are seeded by whoever creates the
//     table, so no INSERT;
//   - <inbox>_redrives: SELECT, INSERT (RecordRedrive, RedriveSummary).
//     The redrive's other steps are on the dead letters (LockDeadLetter,
//     DeleteDeadLetter, FailDeadLetterAgain), already granted.
//
// The optional tables must exist before these grants run (GRANT on a
// missing table is error 1146), created by an account holding
// ControllerGrants: the controller creates the outbox of an inbox whose
// resource uses one; the redrives log is created by the first redrive run
// (its Migrate), so under these grants it is created once beforehand by
// the controller's account (a Migrate with WithRedrives). A Migrate under
// these grants then finds every table and runs no DDL.
//
// The conformance suite runs the runtime under exactly RuntimeGrants, with
// and without the optional tables (runtime/sink/sinktest, LeastPrivilege).

// RuntimeGrants are the GRANT statements the runtime's account needs on
// the inbox n in layout, with the optional tables opts asks for (the
// options the runtime opens the inbox with; none: the inbox's own tables
// only); account is "user@host".
func RuntimeGrants(n inbox.Names, layout config.Layout, account string, opts ...inbox.Option) []string {
	var o inbox.Options
	for _, opt := range opts {
		opt(&o)
	}
	to := " TO " + accountSQL(account)
	on := func(privs, table string) string { return "GRANT " + privs + " ON " + qualify(n.Schema, table) + to }
	inboxPrivs := "SELECT, INSERT, UPDATE, DELETE"
	out := []string{}
	if layout == config.LayoutPartitioned {
		inboxPrivs += ", ALTER, DROP"
		out = append(out, on("SELECT, INSERT, UPDATE", claimLocksName(n)), grantOn("LOCK TABLES", n.Schema, account))
	}
	out = append(out,
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
	if o.Outbox {
		out = append(out, on("SELECT, INSERT, UPDATE, DELETE", n.Outbox), on("SELECT, UPDATE", shardsNameOf(n)))
	}
	if o.Redrives {
		out = append(out, on("SELECT, INSERT", n.Redrives))
	}
	return out
}

// ControllerGrants is the GRANT the controller's account needs on the
// database that holds its inboxes.
func ControllerGrants(database, account string) []string {
	return []string{grantOn("SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX, LOCK TABLES", database, account)}
}
