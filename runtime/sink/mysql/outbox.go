package mysql

// The transactional outbox (spec.emit, http delivery: Outbox) and its
// relay, on MySQL/MariaDB. The semantics are runtime/inbox/outbox.go's
// (PostgreSQL), the reference.
//
// The relay's shard lock. PostgreSQL takes a transaction advisory lock
// (pg_try_advisory_xact_lock), released at commit or rollback. MySQL's
// GET_LOCK is a session lock: it outlives the transaction, and database/sql
// hands the transaction's connection back to the pool at commit still
// holding it, so the shard would stay locked by an idle connection (and a
// RELEASE_LOCK after commit cannot be made reliable: a failed commit, a
// killed connection, a panic). So each shard is a row of
// <inbox>_outbox_shards, seeded when the outbox is created, and the relay
// locks it with SELECT … FOR UPDATE SKIP LOCKED (MySQL 8.0+, MariaDB
// 10.6+): an InnoDB record lock, which ends with the transaction whatever
// way it ends, and which a second relay skips instead of waiting for (no
// row back: ok false). The events are then locked in id order, FOR UPDATE
// SKIP LOCKED as on PostgreSQL.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// The quoted, qualified outbox tables and the relay's index.
func (s *Inbox) outboxTable() string { return qualify(s.names.Schema, s.names.Outbox) }

func (s *Inbox) unsentIndex() string {
	return quote(inbox.DerivedNameMax(s.names.Outbox, "_unsent_idx", MaxIdentifier))
}

func (s *Inbox) sentAtIndex() string {
	return quote(inbox.DerivedNameMax(s.names.Outbox, "_sent_at_idx", MaxIdentifier))
}

// shardsNameOf is the name of the relay's shard rows of the inbox n.
func shardsNameOf(n inbox.Names) string {
	return inbox.DerivedNameMax(n.Outbox, "_shards", MaxIdentifier)
}

func (s *Inbox) shardsTable() string { return qualify(s.names.Schema, shardsNameOf(s.names)) }

func (s *Inbox) redrivesTable() string { return qualify(s.names.Schema, s.names.Redrives) }

// optionalDDL is the DDL of the optional tables the options ask for
// (Options.Outbox, Options.Redrives) that are not there yet, so an inbox
// migrated without them gets them when a later Migrate asks (as on
// PostgreSQL), and a Migrate that finds them runs no DDL: CREATE TABLE IF
// NOT EXISTS wants the CREATE privilege even on a table that exists, which
// the runtime's grants do not give (RuntimeGrants). The outbox is there
// with every shard row seeded (a crash between the shards table and its
// seed leaves it short; the seed is INSERT IGNORE, run again).
//
// unseen are the optional tables asked for that the account does not see:
// missing, or not granted to it (information_schema cannot tell which).
func (s *Inbox) optionalDDL(ctx context.Context, q queryer) (stmts, unseen []string, err error) {
	if !s.opts.Outbox && !s.opts.Redrives {
		return nil, nil, nil
	}
	// information_schema shows an account the tables it holds a privilege
	// on: the runtime's grants name these.
	rows, err := q.QueryContext(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = ? AND table_name IN (?, ?, ?)`,
		s.names.Schema, s.names.Outbox, shardsNameOf(s.names), s.names.Redrives)
	if err != nil {
		return nil, nil, fmt.Errorf("while looking for the outbox and redrive tables: %w", err)
	}
	defer func() { _ = rows.Close() }()
	have := map[string]bool{}
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, nil, fmt.Errorf("while looking for the outbox and redrive tables: %w", err)
		}
		have[t] = true
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("while looking for the outbox and redrive tables: %w", err)
	}
	var want []string
	if s.opts.Outbox {
		want = append(want, s.names.Outbox, shardsNameOf(s.names))
		seeded := 0
		if have[s.names.Outbox] && have[shardsNameOf(s.names)] {
			if err := q.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+s.shardsTable()).Scan(&seeded); err != nil {
				return nil, nil, fmt.Errorf("while counting the outbox shards: %w", err)
			}
		}
		if seeded < inbox.OutboxShards {
			stmts = append(stmts, s.outboxDDL()...)
		}
	}
	if s.opts.Redrives {
		want = append(want, s.names.Redrives)
		if !have[s.names.Redrives] {
			stmts = append(stmts, s.redrivesDDL())
		}
	}
	for _, t := range want {
		if !have[t] {
			unseen = append(unseen, t)
		}
	}
	return stmts, unseen, nil
}

// optionalTables are every optional table, for Drop.
func (s *Inbox) optionalTables() []string {
	return []string{s.outboxTable(), s.shardsTable(), s.redrivesTable()}
}

// migrateOptional runs optionalDDL on conn (under the migration lock). A
// failure names the tables the account did not see: under the runtime's
// grants a CREATE refused means one is missing or not granted to it.
func (s *Inbox) migrateOptional(ctx context.Context, conn *sql.Conn) error {
	stmts, unseen, err := s.optionalDDL(ctx, conn)
	if err != nil {
		return err
	}
	for _, stmt := range stmts {
		if _, err := conn.ExecContext(ctx, stmt); err != nil {
			why := "the outbox's shard rows are not all seeded"
			if len(unseen) > 0 {
				why = strings.Join(unseen, ", ") + ": missing, or not granted to this account; an account holding only " +
					"mysql.RuntimeGrants needs them created first and granted with the inbox's options"
			}
			return fmt.Errorf("while creating the outbox and redrive tables (%s): %w", why, err)
		}
	}
	return nil
}

// outboxDDL: the outbox at its current shape (inbox.Store.outboxDDL's
// columns) and the shard rows the relay locks. MySQL has no partial index:
// (shard, sent_at, id) serves the relay's "unsent of one shard in id
// order", (sent_at) the backlog gauge and prune.
func (s *Inbox) outboxDDL() []string {
	var seed strings.Builder
	for i := range inbox.OutboxShards {
		if i > 0 {
			seed.WriteString(", ")
		}
		fmt.Fprintf(&seed, "(%d)", i)
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + s.outboxTable() + ` (
			id         BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
			event_id   VARBINARY(1024) NOT NULL,
			source_id  VARBINARY(1024) NOT NULL,
			shard      SMALLINT NOT NULL,
			payload    LONGBLOB NOT NULL,
			created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
			sent_at    DATETIME(6) NULL,
			headers    JSON NULL,
			order_key  BLOB NULL,
			attempts   INT NOT NULL DEFAULT 0,
			last_error TEXT NULL,
			UNIQUE KEY ` + quote(inbox.DerivedNameMax(s.names.Outbox, "_event_id_key", MaxIdentifier)) + ` (event_id),
			KEY ` + s.unsentIndex() + ` (shard, sent_at, id),
			KEY ` + s.sentAtIndex() + ` (sent_at)
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`,
		`CREATE TABLE IF NOT EXISTS ` + s.shardsTable() + ` (
			shard SMALLINT NOT NULL PRIMARY KEY
		) ENGINE=InnoDB`,
		`INSERT IGNORE INTO ` + s.shardsTable() + ` (shard) VALUES ` + seed.String(),
	}
}

// outboxHeaders encodes an event's headers (NULL for none).
func outboxHeaders(eventID string, h map[string]string) (any, error) {
	if len(h) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("while encoding the headers of outbox event %s: %w", eventID, err)
	}
	return string(b), nil
}

// WriteOutbox inserts rows in tx (the claim transaction), one statement;
// an event id already present is kept as it is. ON DUPLICATE KEY UPDATE
// id = id, not INSERT IGNORE: IGNORE would also turn a value that does not
// fit into a warning.
func (s *Inbox) WriteOutbox(ctx context.Context, tx sink.Tx, rows []inbox.OutboxRow) (err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	if len(rows) == 0 {
		return nil
	}
	t, err := sqlTx(tx)
	if err != nil {
		return err
	}
	args := make([]any, 0, 6*len(rows))
	for _, r := range rows {
		h, err := outboxHeaders(r.EventID, r.Headers)
		if err != nil {
			return err
		}
		args = append(args, []byte(r.EventID), []byte(r.SourceID), r.Shard, payloadArg(r.Payload), h, nullBytes(r.OrderKey))
	}
	if _, err := t.ExecContext(ctx, `INSERT INTO `+s.outboxTable()+` (event_id, source_id, shard, payload, headers, order_key)
		VALUES `+placeholders(len(rows), 6)+` ON DUPLICATE KEY UPDATE id = id`, args...); err != nil {
		return fmt.Errorf("while writing %d outbox rows: %w", len(rows), err)
	}
	return nil
}

// payloadArg is never NULL (the column is NOT NULL; an empty payload is
// empty bytes).
func payloadArg(p []byte) []byte {
	if p == nil {
		return []byte{}
	}
	return p
}

// ClaimOutboxShard locks shard's row for tx (ok false when another relay
// holds it: SKIP LOCKED, never a wait) and locks up to limit of its unsent
// rows in id order. The unsent index is forced: a locking read locks every
// record it examines, and the optimizer, on a small outbox, picks the
// (sent_at) index, whose "IS NULL" range holds every shard's unsent rows;
// the relay of another shard would then find its rows locked and skip
// them (seen on MariaDB 10.11, the conformance suite's OutboxAndRelay).
func (s *Inbox) ClaimOutboxShard(ctx context.Context, tx sink.Tx, shard, limit int) (_ []inbox.PendingEvent, _ bool, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	t, err := sqlTx(tx)
	if err != nil {
		return nil, false, err
	}
	if !s.d.skipLock {
		return nil, false, fmt.Errorf("while taking the relay lock of outbox shard %d: server %s has no FOR UPDATE SKIP LOCKED (MySQL 8.0+, MariaDB 10.6+)", shard, s.d.version)
	}
	var got int
	err = t.QueryRowContext(ctx, `SELECT shard FROM `+s.shardsTable()+` WHERE shard = ? FOR UPDATE SKIP LOCKED`, shard).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("while taking the relay lock of outbox shard %d: %w", shard, err)
	}
	rows, err := t.QueryContext(ctx, `SELECT id, event_id, source_id, shard, payload, headers, COALESCE(order_key, source_id), created_at, attempts
		FROM `+s.outboxTable()+` FORCE INDEX (`+s.unsentIndex()+`)
		WHERE shard = ? AND sent_at IS NULL ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED`, shard, limit)
	if err != nil {
		return nil, true, fmt.Errorf("while claiming outbox shard %d: %w", shard, err)
	}
	defer func() { _ = rows.Close() }()
	var events []inbox.PendingEvent
	for rows.Next() {
		var e inbox.PendingEvent
		var eventID, source, key, headers []byte
		if err := rows.Scan(&e.ID, &eventID, &source, &e.Shard, &e.Payload, &headers, &key, &e.CreatedAt, &e.Attempts); err != nil {
			return nil, true, fmt.Errorf("while reading outbox shard %d: %w", shard, err)
		}
		e.EventID, e.SourceID, e.OrderKey = string(eventID), string(source), string(key)
		if len(headers) > 0 {
			if err := json.Unmarshal(headers, &e.Headers); err != nil {
				return nil, true, fmt.Errorf("while decoding the headers of outbox event %s: %w", e.EventID, err)
			}
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return nil, true, fmt.Errorf("while reading outbox shard %d: %w", shard, err)
	}
	return events, true, nil
}

// idList is "?, ?, …" and the ids as arguments.
func idList(ids []int64) (string, []any) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", "), args
}

// MarkOutboxSent marks rows sent in tx, the transaction that claimed them.
func (s *Inbox) MarkOutboxSent(ctx context.Context, tx sink.Tx, ids []int64) (err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	if len(ids) == 0 {
		return nil
	}
	t, err := sqlTx(tx)
	if err != nil {
		return err
	}
	in, args := idList(ids)
	if _, err := t.ExecContext(ctx, `UPDATE `+s.outboxTable()+` SET sent_at = UTC_TIMESTAMP(6) WHERE id IN (`+in+`)`, args...); err != nil {
		return fmt.Errorf("while marking %d outbox rows sent: %w", len(ids), err)
	}
	return nil
}

// NoteOutboxFailure records in tx that the events failed with reason;
// counted adds one to their attempts. UPDATE has no RETURNING on MySQL or
// MariaDB: the attempts are read back in tx, which holds the rows.
func (s *Inbox) NoteOutboxFailure(ctx context.Context, tx sink.Tx, ids []int64, reason string, counted bool) (_ map[int64]int, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	if len(ids) == 0 {
		return nil, nil
	}
	t, err := sqlTx(tx)
	if err != nil {
		return nil, err
	}
	inc := 0
	if counted {
		inc = 1
	}
	in, args := idList(ids)
	if _, err := t.ExecContext(ctx, `UPDATE `+s.outboxTable()+` SET attempts = attempts + ?, last_error = LEFT(?, 1024)
		WHERE id IN (`+in+`)`, append([]any{inc, inbox.CleanText(reason)}, args...)...); err != nil {
		return nil, fmt.Errorf("while recording the failure of %d outbox events: %w", len(ids), err)
	}
	rows, err := t.QueryContext(ctx, `SELECT id, attempts FROM `+s.outboxTable()+` WHERE id IN (`+in+`)`, args...)
	if err != nil {
		return nil, fmt.Errorf("while recording the failure of %d outbox events: %w", len(ids), err)
	}
	defer func() { _ = rows.Close() }()
	out := make(map[int64]int, len(ids))
	for rows.Next() {
		var id int64
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("while recording the failure of %d outbox events: %w", len(ids), err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("while recording the failure of %d outbox events: %w", len(ids), err)
	}
	return out, nil
}

// DeadLetterOutbox moves a claimed event the target refused for good from
// the outbox to the dead letters, in tx (see inbox.Store.DeadLetterOutbox).
func (s *Inbox) DeadLetterOutbox(ctx context.Context, tx sink.Tx, e inbox.PendingEvent, reason, class string) (err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	t, err := sqlTx(tx)
	if err != nil {
		return err
	}
	if _, err := s.DeadLetter(ctx, tx, []inbox.DeadLetter{{MessageID: e.SourceID, NativeID: inbox.OutboxNativeIDPrefix + e.EventID,
		Reason: "outbox: " + reason, Class: class, Payload: e.Payload, Headers: e.Headers, Attempts: max(e.Attempts, 1)}}); err != nil {
		return err
	}
	if _, err := t.ExecContext(ctx, `DELETE FROM `+s.outboxTable()+` WHERE id = ?`, e.ID); err != nil {
		return fmt.Errorf("while removing rejected outbox event %s: %w", e.EventID, err)
	}
	return nil
}

// OutboxStats counts unsent rows and the age of the oldest (database clock).
func (s *Inbox) OutboxStats(ctx context.Context) (_ inbox.OutboxStats, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	var st inbox.OutboxStats
	var us int64
	err = s.d.db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)), 0)
		FROM `+s.outboxTable()+` WHERE sent_at IS NULL`).Scan(&st.Pending, &us)
	if err != nil {
		return st, fmt.Errorf("while reading outbox stats: %w", err)
	}
	st.OldestAge = time.Duration(us) * time.Microsecond
	return st, nil
}

// PruneOutbox deletes rows sent before the database clock minus window,
// batchSize per transaction (ids selected FOR UPDATE SKIP LOCKED, then
// deleted: a relay's locked rows are skipped, never waited for), until none
// are left or maxDuration passed. Unsent rows are never deleted. An inbox
// without an outbox table has nothing to prune.
func (s *Inbox) PruneOutbox(ctx context.Context, window time.Duration, batchSize int, maxDuration time.Duration) (_ int64, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	if batchSize < 1 {
		return 0, fmt.Errorf("while pruning the outbox: batch size must be positive, got %d", batchSize)
	}
	if exists, err := s.tableExists(ctx, s.names.Outbox); err != nil || !exists {
		return 0, err
	}
	if !s.d.skipLock {
		return 0, fmt.Errorf("while pruning the outbox: server %s has no FOR UPDATE SKIP LOCKED (MySQL 8.0+, MariaDB 10.6+)", s.d.version)
	}
	var deleted int64
	for deadline := time.Now().Add(maxDuration); time.Now().Before(deadline); {
		n, err := s.pruneOutboxBatch(ctx, window, batchSize)
		if err != nil {
			return deleted, fmt.Errorf("while deleting a batch of sent outbox rows: %w", err)
		}
		deleted += n
		if n == 0 {
			break
		}
	}
	return deleted, nil
}

func (s *Inbox) pruneOutboxBatch(ctx context.Context, window time.Duration, batchSize int) (int64, error) {
	tx, err := s.d.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	// The sent_at index is forced (see ClaimOutboxShard): another plan
	// would lock unsent rows too, which a relay would then skip, out of
	// order.
	rows, err := tx.QueryContext(ctx, `SELECT id FROM `+s.outboxTable()+` FORCE INDEX (`+s.sentAtIndex()+`)
		WHERE sent_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND LIMIT ? FOR UPDATE SKIP LOCKED`, window.Microseconds(), batchSize)
	if err != nil {
		return 0, err
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			_ = rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, tx.Commit()
	}
	in, args := idList(ids)
	res, err := tx.ExecContext(ctx, `DELETE FROM `+s.outboxTable()+` WHERE id IN (`+in+`)`, args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	return n, tx.Commit()
}

// RequeueOutbox puts a dead-lettered outbox event back in the outbox,
// unsent and with no attempts, in tx (the redrive's, which also deletes the
// dead letter); its shard is its source id's (inbox.Store.RequeueOutbox).
func (s *Inbox) RequeueOutbox(ctx context.Context, tx sink.Tx, d inbox.StoredDeadLetter) (err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	t, err := sqlTx(tx)
	if err != nil {
		return err
	}
	eventID := strings.TrimPrefix(d.NativeID, inbox.OutboxNativeIDPrefix)
	h, err := outboxHeaders(eventID, d.Headers)
	if err != nil {
		return err
	}
	if _, err := t.ExecContext(ctx, `INSERT INTO `+s.outboxTable()+` (event_id, source_id, shard, payload, headers)
		VALUES (?, ?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE sent_at = NULL, attempts = 0, last_error = NULL`,
		[]byte(eventID), []byte(d.MessageID), inbox.OutboxShard(d.MessageID), payloadArg(d.Payload), h); err != nil {
		return fmt.Errorf("while requeueing outbox event %s: %w", eventID, err)
	}
	return nil
}

// tableExists says whether table (unqualified) is in the inbox's database.
func (s *Inbox) tableExists(ctx context.Context, table string) (bool, error) {
	var n int
	if err := s.d.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?`,
		s.names.Schema, table).Scan(&n); err != nil {
		return false, fmt.Errorf("while looking for table %s: %w", table, err)
	}
	return n > 0, nil
}
