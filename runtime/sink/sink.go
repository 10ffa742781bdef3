// Package sink is the dialect seam: the one place that names what differs
// between the sink databases (PostgreSQL, MySQL/MariaDB), at the level of the
// operations the runtime performs, never of SQL strings. Each dialect is a
// package that implements DB, Inbox and Effect with its own driver and its
// own statements:
//
//   - runtime/sink/postgres: pgx, over the existing runtime/inbox Store and
//     runtime/effect effects. Nothing of PostgreSQL's SQL moved, and its hot
//     path gains no allocation and no round trip: Tx is satisfied by pgx.Tx
//     itself, so passing one through the seam is an interface conversion and
//     a type assertion (BenchmarkSeam in runtime/sink/postgres measures it).
//   - runtime/sink/mysql: database/sql with github.com/go-sql-driver/mysql.
//
// What is the same for both stays outside the dialects and is shared: the
// value types of runtime/inbox (Claim, DeadLetter, Heartbeat,
// ProgressRecord, WindowState, Bound, PruneResult, Owner, the identity
// decisions of inbox.State), the effect's Record and Result, the batch
// collapse per entity key, the loop's retry, bisection and hold rules.
//
// # The operations and how each dialect does them
//
// The claim (Inbox.Claim) is set-based, one statement per batch, the ids
// sorted so that concurrent claims lock in one order:
//
//   - PostgreSQL: INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING
//     RETURNING message_id.
//   - MariaDB 10.5+: INSERT IGNORE … VALUES (…),(…) RETURNING message_id,
//     which returns only the rows it inserted (… ON DUPLICATE KEY UPDATE …
//     RETURNING returns every row, duplicates included, so it cannot tell
//     new from old). IGNORE would also turn a too-long value into a
//     warning; the claim refuses ids longer than the column in Go first, and
//     the fingerprint is an int64, so the only error IGNORE absorbs is the
//     duplicate key.
//   - MySQL 8 has no RETURNING: the claim reads which ids exist (LOCK IN
//     SHARE MODE: prune skips them), inserts the rest with … ON DUPLICATE
//     KEY UPDATE message_id = message_id, and checks the affected-rows count
//     against the prediction. A concurrent claim of the same id in between
//     makes the count differ: the claim then fails with a transient error
//     (ErrClaimRace, ClassUnavailable) and the batch is retried, never
//     dead-lettered. Two round trips. The strategy is chosen from the
//     server's version at open; both run on MariaDB in the conformance
//     suite, but MySQL 8 itself is untested here (no MySQL 8 server on this
//     machine, and the module proxy serves no way to run one).
//
// Isolation: READ COMMITTED on both. On InnoDB, REPEATABLE READ (its
// default) takes next-key (gap) locks on the duplicate checks of INSERT and
// on locking reads, and two claims inserting neighbouring new ids then
// deadlock on each other's gaps; READ COMMITTED keeps record locks only
// (duplicate-key checks still lock the record, in the sorted order). The
// MySQL dialect sets it per session when a connection is made (SET SESSION
// TRANSACTION ISOLATION LEVEL READ COMMITTED, with sql_mode strict and
// time_zone UTC), so Begin is a bare START TRANSACTION: a per-transaction
// level would cost a round trip per batch.
//
// The sequence-gated upsert (DB.Effect, upsert): the batch is collapsed per
// key to the highest sequence in Go (runtime/effect, shared), then
//
//   - PostgreSQL: one INSERT … ON CONFLICT DO UPDATE … WHERE cur.seq <
//     EXCLUDED.seq, whose affected rows are the applied ones.
//   - MySQL: SELECT key, seq … FOR UPDATE of the batch's keys (record locks,
//     sorted), then one INSERT … VALUES … ON DUPLICATE KEY UPDATE whose
//     assignments are each gated by IF(seq IS NULL OR seq < VALUES(seq), …)
//     with the sequence column assigned last (MySQL evaluates assignments
//     left to right, each seeing the ones before). The gate stays in the
//     statement, so the state is right even when a concurrent insert of a
//     new key lands between the two; the pre-read only makes the counts
//     (applied, stale, changed) exact, which ON DUPLICATE KEY's affected rows
//     (1 insert, 2 update, 0 unchanged) cannot.
//
// Append is one multi-row INSERT on both. Dead letters: PostgreSQL ON
// CONFLICT (native_id) DO NOTHING RETURNING; MySQL reads which native ids
// are there and inserts the rest (rare path, two round trips).
//
// The outbox relay's shard lock (Outbox.ClaimOutboxShard): PostgreSQL's
// transaction advisory lock (pg_try_advisory_xact_lock); on MySQL a row
// per shard in <outbox>_shards locked FOR UPDATE SKIP LOCKED (GET_LOCK is
// a session lock that outlives the transaction on a pooled connection).
// Both end with the transaction and never wait: a held shard is ok=false.
// The shard's events are then locked in id order FOR UPDATE SKIP LOCKED;
// MySQL forces the indexes of the relay's and the outbox prune's reads, so
// that neither locks rows outside what it selects (which another relay
// would skip, out of order). Redrive is exactly once on both: the dead
// letter is locked FOR UPDATE SKIP LOCKED, deleted and its outcome
// recorded in one transaction.
//
// The sql effect: the statement's :name parameters are compiled by one
// parser (runtime/effect, ConvertNamedParams and ConvertNamedParamsMySQL,
// each with its dialect's quoting and comments) into $n (one per name) or
// ? (one per use), bound from the value expressions; one statement per
// message, queued in one pgx.Batch on PostgreSQL, one round trip each on
// MySQL (database/sql has no pipeline).
//
// Progress rows and the stored window: the same rows; every time is the
// database clock (now() on PostgreSQL, UTC_TIMESTAMP(6) into DATETIME(6) on
// MySQL, read back as UTC). The window's read-modify-write is serialized by
// PostgreSQL's transaction advisory lock, and on MySQL by a row lock on the
// inbox's meta row (SELECT … FOR UPDATE: the row always exists once
// migrated, unlike the window row, which FOR UPDATE cannot lock before it
// exists).
//
// Prune, Table layout: batched deletes that never wait for a claim.
// PostgreSQL deletes by ctid from a FOR UPDATE SKIP LOCKED subselect; MySQL
// (8.0+ / MariaDB 10.6+) selects a batch of ids FOR UPDATE SKIP LOCKED and
// deletes those ids, each batch its own short transaction.
//
// Errors (DB.Classify): each dialect maps its codes onto the same classes
// and reasons (Class, Reason*: the consumer's hold reasons and
// idc_sink_misconfigured labels). PostgreSQL by SQLSTATE: the one table is
// runtime/sink/postgres's, which runtime/consumer classifies with. MySQL by
// error number: 1213 deadlock and 1205 lock wait timeout are
// ClassUnavailable (transient: retried on the bounded backoff, never
// counted as an attempt, never dead-lettered; InnoDB may roll back only
// the statement on 1205, so the loop always rolls the whole transaction
// back), as are connection errors, 1040 and 1053; 1146 no such table, 1054
// unknown column, 1142/1143/1044/1227 privilege, 1064 syntax, 1792/1290
// read-only are ClassSink; data errors (1264, 1265, 1292, 1366, 1406,
// 1048, 1062, SQLSTATE 22/23) are ClassData; the rest, statement timeouts
// included, ClassMessages, as on PostgreSQL.
//
// DDL (Inbox.Migrate): PostgreSQL runs it in one transaction under an
// advisory lock. MySQL has no transactional DDL (each statement commits),
// so its migration is a sequence of idempotent steps under GET_LOCK on one
// connection (a session lock: it ends with the connection, so a migrator
// that dies never leaves it held): CREATE TABLE IF NOT EXISTS for every
// table, the meta table last, and its row (schema version, layout) written
// only after every other table exists; no meta row reads as "not
// migrated", so a crash between two steps is completed by the next pass.
// Schema version 7 is the first MySQL shape, so nothing is upgraded in
// place yet; a later version adds nullable columns with ADD COLUMN IF NOT
// EXISTS (MariaDB; MySQL 8 reads information_schema first) and
// ALGORITHM=INSTANT, which bounds the lock on a live inbox to a metadata
// change. MySQL has no TRUNCATE trigger: the epoch is also written as a
// marker row in the inbox table (an id starting with NUL, which no message
// id has, processed in year 9999, which prune never reaches), and a marker
// that is gone reads as a truncated epoch (inbox.LostError). Identifiers
// follow MySQL: at most 64 characters (derived names shortened with a
// hash), validated, quoted with backticks.
//
// Round trips per batch of a sequence-gated upsert: PostgreSQL 4 (BEGIN,
// claim, upsert, COMMIT); MariaDB 5 (the upsert's pre-read). Statements
// with arguments are one round trip on MySQL because the driver
// interpolates them (no server-side prepare per statement).
//
// The Partitioned layout on MySQL (runtime/sink/mysql partitions.go):
// RANGE COLUMNS partitions by publish day under a MAXVALUE catch-all, the
// key (message_id, published_on), and the same guarantee as PostgreSQL's
// claim across partitions through per-id-hash row locks in a slot table
// (PostgreSQL: transaction advisory locks). Privilege errors name the GRANT
// to run on both (mysql.Advice, postgres.Advice), and each dialect lists
// its runtime's least-privilege grants (RuntimeGrants; docs/mysql.md).
//
// Everything the runtime does with its sink goes through the seam: the
// loop, prune, redrive, the relay and the dead-letter listing; the
// controller's sinkdb (the preflight, migrations and identity) too.
package sink

import (
	"context"
	"errors"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// Kind names a dialect (the runtime config's sink.kind).
type Kind = config.SinkKind

const (
	Postgres = config.SinkPostgres
	MySQL    = config.SinkMySQL
)

// Tx is the claim transaction of one lane batch, opened by DB.Begin. An
// Inbox or Effect accepts only a Tx its own DB opened. pgx.Tx satisfies it
// as it is.
type Tx interface {
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Class is what a failed transaction says, and so what the loop does with
// it (runtime/consumer's failure kinds).
type Class int

const (
	// ClassMessages: something about these messages, or an unknown cause:
	// retried, counted, bisected, dead-lettered after maxAttempts.
	ClassMessages Class = iota
	// ClassData: a value of one message does not fit: the message is
	// dead-lettered.
	ClassData
	// ClassUnavailable: the database, the path to it, or another
	// transaction (deadlock, lock wait, serialization): retried until it
	// passes, never counted as an attempt, never dead-lettered.
	ClassUnavailable
	// ClassSink: the sink itself is wrong (missing table, column, key,
	// privilege, read-only): the loop holds with the reason.
	ClassSink
)

// The reasons of ClassSink: the bounded label values of
// idc_sink_misconfigured and what /readyz says (runtime/consumer's Sink*
// constants are these).
const (
	ReasonUndefinedTable        = "undefined_table"
	ReasonUndefinedColumn       = "undefined_column"
	ReasonUndefinedObject       = "undefined_object"
	ReasonNoUniqueConstraint    = "no_unique_constraint"
	ReasonInsufficientPrivilege = "insufficient_privilege"
	ReasonInvalidStatement      = "invalid_statement"
	ReasonReadOnly              = "read_only"
	ReasonAuthentication        = "authentication"
	ReasonUndefinedDatabase     = "undefined_database"
	ReasonInboxLost             = "inbox_lost"
)

// DB is one sink database as the runtime uses it.
type DB interface {
	Kind() Kind
	// Begin opens the transaction of one lane batch (READ COMMITTED).
	Begin(ctx context.Context) (Tx, error)
	Ping(ctx context.Context) error
	// Classify says what err, from a transaction of this DB, means; reason
	// is one of the Reason* values for ClassSink.
	Classify(err error) (c Class, reason string)
	// Inbox is the inbox the sink config names (Schema is the database on
	// MySQL).
	Inbox(sink config.Sink, opts ...inbox.Option) (Inbox, error)
	// Effect builds a transactional effect (upsert, append, sql) whose
	// tables are in schema.
	Effect(cfg config.Effect, schema string, entity *config.Entity) (Effect, error)
	// PhysicalDatabase names the physical database that holds the inbox
	// sink names, from the database itself and never from the connection
	// string ("<identity>/<database>"): PostgreSQL's system identifier and
	// current_database(), MySQL's identity row minted once in that database
	// (runtime/sink/mysql physical.go says why). The controller records it
	// in status.inbox.database.
	PhysicalDatabase(ctx context.Context, sink config.Sink) (string, error)
	// Close releases the connections.
	Close()
}

// Inbox is the inbox of one consumer in one dialect: the operations whose
// statements differ between the databases. It is everything the runtime
// (loop, prune, redrive, relay, dead-letter listing) and the controller
// (sinkdb) do with an inbox; nothing outside a dialect package writes SQL
// against one.
type Inbox interface {
	// Names are the inbox's table names (Schema is the database on MySQL).
	Names() inbox.Names
	// QualifiedInbox is the quoted, qualified inbox table (for logs).
	QualifiedInbox() string
	Layout() config.Layout

	// Migrate creates or upgrades every table of the inbox and records the
	// schema version; idempotent, safe concurrently and after a crash.
	Migrate(ctx context.Context) error
	// MigrateFor is Migrate for the controller's claim: it refuses a lost
	// inbox or another owner's, records the owner, mints the epoch.
	MigrateFor(ctx context.Context, c *inbox.OwnerClaim) (inbox.Identity, error)
	// Check reads the inbox's identity and version for the controller
	// without changing anything; ready says it is migrated, current and
	// the claim's.
	Check(ctx context.Context, c inbox.OwnerClaim) (id inbox.Identity, version int, ready bool, err error)
	// SchemaVersion is the recorded version, 0 when not migrated.
	SchemaVersion(ctx context.Context) (int, error)
	// Verify says whether the inbox still holds the expected epoch
	// (inbox.LostError when not).
	Verify(ctx context.Context) error
	// MarkRestored records that the inbox of epoch was restored from a
	// backup: it reads as lost until the controller claims it again.
	MarkRestored(ctx context.Context, epoch string) error
	// Drop removes every table of the inbox, only when its meta row marks
	// them as the operator's; DropOwned only when they are owner's.
	Drop(ctx context.Context) error
	DropOwned(ctx context.Context, owner inbox.Owner) error

	// Claim records the ids in tx and returns the new ones (in-batch
	// repeats claimed once).
	Claim(ctx context.Context, tx Tx, claims []inbox.Claim) (map[string]struct{}, error)
	// Unclaim releases ids claimed earlier in tx.
	Unclaim(ctx context.Context, tx Tx, ids []string) error
	// Existing returns which of ids are claimed (outside a transaction).
	Existing(ctx context.Context, ids []string) (map[string]struct{}, error)
	// Conflicts finds the duplicates of claims whose fingerprint differs
	// from the one claimed first; RecordConflicts keeps them.
	Conflicts(ctx context.Context, tx Tx, claims []inbox.Claim, fresh map[string]struct{}) ([]inbox.Conflict, error)
	RecordConflicts(ctx context.Context, tx Tx, rows []inbox.ConflictRecord) error
	ConflictCount(ctx context.Context) (int64, error)
	// DeadLetter inserts the rows in tx and reports which were new (one
	// per broker native id).
	DeadLetter(ctx context.Context, tx Tx, dls []inbox.DeadLetter) ([]bool, error)

	// WriteHeartbeat upserts the replica's progress row (database clock).
	WriteHeartbeat(ctx context.Context, hb inbox.Heartbeat) error
	// Progress returns the database's clock and every progress row, oldest
	// heartbeat first.
	Progress(ctx context.Context) (time.Time, []inbox.ProgressRecord, error)
	MarkStale(ctx context.Context, rec inbox.ProgressRecord, mark map[string]int64) error
	RetireProgress(ctx context.Context, rec inbox.ProgressRecord) error

	// ReadWindow and UpdateWindow keep the adopted retention window beside
	// the data (runtime/retention.AdoptStored decides).
	ReadWindow(ctx context.Context) (*inbox.WindowState, error)
	UpdateWindow(ctx context.Context, fn func(current *inbox.WindowState) (*inbox.WindowState, error)) (*inbox.WindowState, error)

	// Stats are the inbox gauges (rows, oldest row's age).
	Stats(ctx context.Context) (inbox.Stats, error)
	// PruneTable deletes ids below the bound's cutoff in batches that never
	// wait for a claim, and records the run.
	PruneTable(ctx context.Context, b inbox.Bound, batchSize int, maxDuration time.Duration) (inbox.PruneResult, error)
	LastPruneRun(ctx context.Context) (*inbox.PruneRun, error)

	Partitions
	Outbox
	DeadLetters
}

// Partitions is the Partitioned layout: one partition per UTC day of
// publish time, dropped whole by prune.
type Partitions interface {
	// EnsurePartitions creates the days from from on; EnsurePartitionsFor
	// the days of these publish times (cached); ForgetPartitions drops the
	// cache (a failed insert may mean a day was pruned).
	EnsurePartitions(ctx context.Context, from time.Time, days int) error
	EnsurePartitionsFor(ctx context.Context, published []time.Time) error
	ForgetPartitions()
	// PrunePartitions drops the days wholly below the bound's cutoff and
	// records the run.
	PrunePartitions(ctx context.Context, b inbox.Bound) (inbox.PruneResult, error)
}

// Outbox is spec.emit's transactional outbox and its relay.
type Outbox interface {
	// WriteOutbox writes the rows in the claim transaction.
	WriteOutbox(ctx context.Context, tx Tx, rows []inbox.OutboxRow) error
	// ClaimOutboxShard takes the shard's lock for tx (ok false when another
	// relay holds it) and returns up to limit pending events in order.
	ClaimOutboxShard(ctx context.Context, tx Tx, shard, limit int) (events []inbox.PendingEvent, ok bool, err error)
	MarkOutboxSent(ctx context.Context, tx Tx, ids []int64) error
	NoteOutboxFailure(ctx context.Context, tx Tx, ids []int64, reason string, counted bool) (map[int64]int, error)
	DeadLetterOutbox(ctx context.Context, tx Tx, e inbox.PendingEvent, reason, class string) error
	OutboxStats(ctx context.Context) (inbox.OutboxStats, error)
	PruneOutbox(ctx context.Context, window time.Duration, batchSize int, maxDuration time.Duration) (int64, error)
}

// DeadLetters is the dead-letter table as listing and redrive use it.
type DeadLetters interface {
	ListDeadLetters(ctx context.Context, f inbox.DeadLetterFilter, excerpt int) (inbox.DeadLetterListing, error)
	SelectDeadLetters(ctx context.Context, f inbox.DeadLetterFilter) ([]int64, error)
	// LockDeadLetter locks the row for tx (nil when gone or locked by
	// another redrive).
	LockDeadLetter(ctx context.Context, tx Tx, id int64) (*inbox.StoredDeadLetter, error)
	DeleteDeadLetter(ctx context.Context, tx Tx, id int64) error
	FailDeadLetterAgain(ctx context.Context, tx Tx, id int64, reason, class string) error
	RecordRedrive(ctx context.Context, tx Tx, r inbox.Redrive) error
	RedriveSummary(ctx context.Context, run string) (inbox.RedriveSummary, error)
	// RequeueOutbox puts an outbox event's dead letter back in the outbox.
	RequeueOutbox(ctx context.Context, tx Tx, d inbox.StoredDeadLetter) error
}

// Effect is a transactional effect in one dialect.
type Effect interface {
	// Apply applies recs inside tx (see effect.Effect).
	Apply(ctx context.Context, tx Tx, recs []*effect.Record) (effect.Result, error)
}

// ChangeTracker is an Effect that can report which records changed state
// (Result.Changed), for emit.when: Changed. TrackChanges turns that on and
// says whether the effect can (an upsert can; append and sql cannot).
type ChangeTracker interface{ TrackChanges() bool }

// TrackChanges turns change tracking on where e has it.
func TrackChanges(e Effect) bool {
	t, ok := e.(ChangeTracker)
	return ok && t.TrackChanges()
}

// InboxFor is the inbox a runtime config names, as its loop, prune and
// redrive open it: with the outbox when spec.emit (or the http outbox)
// uses one, claiming only into the epoch the controller provisioned.
func InboxFor(db DB, cfg *config.Config, opts ...inbox.Option) (Inbox, error) {
	return db.Inbox(cfg.Sink, append([]inbox.Option{inbox.WithOutbox(cfg.UsesOutbox()), inbox.WithExpectedEpoch(cfg.Sink.InboxEpoch)}, opts...)...)
}

// ErrForeignTx is returned when an Inbox or Effect is handed a Tx another
// dialect opened.
var ErrForeignTx = errors.New("the transaction was not opened by this sink database")

// ErrUnsupported is an operation or effect the dialect does not have yet.
var ErrUnsupported = errors.New("not supported by this sink database yet")
