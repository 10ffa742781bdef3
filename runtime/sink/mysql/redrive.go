package mysql

// The dead-letter listing and the redrive primitives on MySQL/MariaDB (the
// semantics of runtime/inbox/deadletters.go and redrive.go). A redrive is
// exactly once per dead letter because its row is locked FOR UPDATE SKIP
// LOCKED (a second redrive skips it, never waits) and deleted, with the
// outcome recorded, in the same transaction.

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

// reasonClassSQL is the dead-letter class expression (inbox.ReasonClassSQL,
// the reason_class column, else the class read from the reason) with the
// reason compared byte for byte, as PostgreSQL's LIKE does: the table's
// utf8mb4 default collation is case-insensitive.
var reasonClassSQL = strings.ReplaceAll(inbox.ReasonClassSQL, "reason LIKE ", "reason COLLATE utf8mb4_bin LIKE ")

// redrivesDDL: the log of redrive outcomes (inbox.Store.redrivesDDL). run
// is bytes (an indexed VARBINARY, compared exactly, no collation).
func (s *Inbox) redrivesDDL() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.redrivesTable() + ` (
			id             BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
			run            VARBINARY(1024) NOT NULL,
			redriven_at    DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
			dead_letter_id BIGINT NOT NULL,
			message_id     VARBINARY(1024) NULL,
			outcome        VARCHAR(64) NOT NULL,
			reason         MEDIUMTEXT NULL,
			KEY ` + quote(inbox.DerivedNameMax(s.names.Redrives, "_run_idx", MaxIdentifier)) + ` (run)
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`
}

// deadLetterWhere is the WHERE clause of f and its arguments, then the
// LIMIT clause ("" for no limit).
func deadLetterWhere(f inbox.DeadLetterFilter) (where string, args []any, limit string) {
	conds := []string{"TRUE"}
	if len(f.Classes) > 0 {
		conds = append(conds, reasonClassSQL+` IN (`+strings.TrimSuffix(strings.Repeat("?, ", len(f.Classes)), ", ")+`)`)
		for _, c := range f.Classes {
			args = append(args, c)
		}
	}
	if len(f.MessageIDs) > 0 {
		conds = append(conds, `message_id IN (`+strings.TrimSuffix(strings.Repeat("?, ", len(f.MessageIDs)), ", ")+`)`)
		for _, id := range f.MessageIDs {
			args = append(args, []byte(id))
		}
	}
	if !f.Since.IsZero() {
		conds = append(conds, `dead_at >= ?`)
		args = append(args, f.Since.UTC())
	}
	if !f.Until.IsZero() {
		conds = append(conds, `dead_at < ?`)
		args = append(args, f.Until.UTC())
	}
	if f.Limit > 0 {
		limit = fmt.Sprintf(" LIMIT %d", f.Limit)
	}
	return strings.Join(conds, " AND "), args, limit
}

// ListDeadLetters returns the dead letters f selects, oldest first, each
// reason cut to excerpt characters; Total counts them before the limit
// (COUNT(*) OVER (): MariaDB 10.2+, MySQL 8.0+).
func (s *Inbox) ListDeadLetters(ctx context.Context, f inbox.DeadLetterFilter, excerpt int) (_ inbox.DeadLetterListing, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	if excerpt <= 0 {
		return inbox.DeadLetterListing{}, fmt.Errorf("the reason excerpt must be positive, got %d", excerpt)
	}
	where, args, limit := deadLetterWhere(f)
	rows, err := s.d.db.QueryContext(ctx, `SELECT id, COALESCE(message_id, ''), COALESCE(native_id, ''), `+reasonClassSQL+`,
			LEFT(reason, ?), CHAR_LENGTH(reason) > ?, COALESCE(attempts, 0), dead_at, published_at, COUNT(*) OVER ()
		FROM `+s.deadLetters+` WHERE `+where+` ORDER BY id`+limit, append([]any{excerpt, excerpt}, args...)...)
	if err != nil {
		return inbox.DeadLetterListing{}, fmt.Errorf("while listing dead letters: %w", err)
	}
	defer func() { _ = rows.Close() }()
	out := inbox.DeadLetterListing{DeadLetters: []inbox.DeadLetterSummary{}}
	for rows.Next() {
		var d inbox.DeadLetterSummary
		var msgID, native []byte
		var published sql.NullTime
		if err := rows.Scan(&d.ID, &msgID, &native, &d.ReasonClass, &d.Reason, &d.ReasonTruncated,
			&d.Attempts, &d.DeadAt, &published, &out.Total); err != nil {
			return inbox.DeadLetterListing{}, fmt.Errorf("while listing dead letters: %w", err)
		}
		d.MessageID, d.NativeID = string(msgID), string(native)
		if published.Valid {
			t := published.Time
			d.PublishedAt = &t
		}
		out.DeadLetters = append(out.DeadLetters, d)
	}
	if err := rows.Err(); err != nil {
		return inbox.DeadLetterListing{}, fmt.Errorf("while listing dead letters: %w", err)
	}
	return out, nil
}

// SelectDeadLetters returns the ids of the rows f selects, oldest first.
func (s *Inbox) SelectDeadLetters(ctx context.Context, f inbox.DeadLetterFilter) (_ []int64, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	where, args, limit := deadLetterWhere(f)
	rows, err := s.d.db.QueryContext(ctx, `SELECT id FROM `+s.deadLetters+` WHERE `+where+` ORDER BY id`+limit, args...)
	if err != nil {
		return nil, fmt.Errorf("while selecting dead letters: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("while selecting dead letters: %w", err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("while selecting dead letters: %w", err)
	}
	return out, nil
}

// LockDeadLetter reads dead letter id in tx and locks it until tx ends; nil
// when the row is gone or another transaction holds it (SKIP LOCKED).
func (s *Inbox) LockDeadLetter(ctx context.Context, tx sink.Tx, id int64) (_ *inbox.StoredDeadLetter, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	t, err := sqlTx(tx)
	if err != nil {
		return nil, err
	}
	if !s.d.skipLock {
		return nil, fmt.Errorf("while locking dead letter %d: server %s has no FOR UPDATE SKIP LOCKED (MySQL 8.0+, MariaDB 10.6+)", id, s.d.version)
	}
	var d inbox.StoredDeadLetter
	var msgID, native, headers []byte
	var class sql.NullString
	var attempts sql.NullInt64
	var published sql.NullTime
	err = t.QueryRowContext(ctx, `SELECT id, message_id, native_id, reason, `+reasonClassSQL+`, payload, headers,
		attempts, published_at, dead_at FROM `+s.deadLetters+` WHERE id = ? FOR UPDATE SKIP LOCKED`, id).Scan(
		&d.ID, &msgID, &native, &d.Reason, &class, &d.Payload, &headers, &attempts, &published, &d.DeadAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("while locking dead letter %d: %w", id, err)
	}
	d.MessageID, d.NativeID, d.Class = string(msgID), string(native), class.String
	d.Attempts = int(attempts.Int64)
	if published.Valid {
		d.PublishedAt = published.Time
	}
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &d.Headers); err != nil {
			return nil, fmt.Errorf("while decoding the headers of dead letter %d: %w", id, err)
		}
	}
	return &d, nil
}

// DeleteDeadLetter removes dead letter id in tx (it was settled).
func (s *Inbox) DeleteDeadLetter(ctx context.Context, tx sink.Tx, id int64) (err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	t, err := sqlTx(tx)
	if err != nil {
		return err
	}
	if _, err := t.ExecContext(ctx, `DELETE FROM `+s.deadLetters+` WHERE id = ?`, id); err != nil {
		return fmt.Errorf("while deleting dead letter %d: %w", id, err)
	}
	return nil
}

// FailDeadLetterAgain records in tx that dead letter id failed once more:
// one attempt more, the new reason and class, dead_at now.
func (s *Inbox) FailDeadLetterAgain(ctx context.Context, tx sink.Tx, id int64, reason, class string) (err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	t, err := sqlTx(tx)
	if err != nil {
		return err
	}
	if _, err := t.ExecContext(ctx, `UPDATE `+s.deadLetters+` SET attempts = COALESCE(attempts, 0) + 1,
		reason = ?, reason_class = NULLIF(?, ''), dead_at = UTC_TIMESTAMP(6) WHERE id = ?`,
		inbox.CleanText(reason), inbox.CleanText(class), id); err != nil {
		return fmt.Errorf("while recording another failure of dead letter %d: %w", id, err)
	}
	return nil
}

// RecordRedrive inserts r in tx.
func (s *Inbox) RecordRedrive(ctx context.Context, tx sink.Tx, r inbox.Redrive) (err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	t, err := sqlTx(tx)
	if err != nil {
		return err
	}
	if _, err := t.ExecContext(ctx, `INSERT INTO `+s.redrivesTable()+` (run, dead_letter_id, message_id, outcome, reason)
		VALUES (?, ?, ?, ?, ?)`, []byte(r.Run), r.DeadLetterID, nullBytes(inbox.CleanText(r.MessageID)), r.Outcome,
		nullText(inbox.CleanText(r.Reason))); err != nil {
		return fmt.Errorf("while recording a redrive: %w", err)
	}
	return nil
}

// RedriveSummary counts the outcomes recorded for run; an inbox no redrive
// ran on has no log yet, and an empty summary.
func (s *Inbox) RedriveSummary(ctx context.Context, run string) (_ inbox.RedriveSummary, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	sum := inbox.RedriveSummary{Run: run, Outcomes: map[string]int{}}
	if exists, err := s.tableExists(ctx, s.names.Redrives); err != nil || !exists {
		return sum, err
	}
	rows, err := s.d.db.QueryContext(ctx, `SELECT outcome, COUNT(*), MAX(redriven_at) FROM `+s.redrivesTable()+`
		WHERE run = ? GROUP BY outcome`, []byte(run))
	if err != nil {
		return sum, fmt.Errorf("while reading redrive run %q: %w", run, err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var outcome string
		var n int
		var last time.Time
		if err := rows.Scan(&outcome, &n, &last); err != nil {
			return sum, fmt.Errorf("while reading redrive run %q: %w", run, err)
		}
		sum.Outcomes[outcome] = n
		if last.After(sum.Last) {
			sum.Last = last
		}
	}
	if err := rows.Err(); err != nil {
		return sum, fmt.Errorf("while reading redrive run %q: %w", run, err)
	}
	return sum, nil
}
