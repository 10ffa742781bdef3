package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// DeadLetterFilter selects dead letters for redrive. Empty fields select
// everything.
type DeadLetterFilter struct {
	// Classes are reason classes (missing_id, invalid_id, invalid_json,
	// evaluation, database, http, id_conflict).
	Classes []string
	// MessageIDs select by message id.
	MessageIDs []string
	// Since and Until bound dead_at (inclusive, exclusive).
	Since, Until time.Time
	// Limit caps the number of rows; 0 is no cap.
	Limit int
}

// reasonClassSQL is the class of a dead-letter row: its reason_class, or for
// rows written before that column existed, the class read from the reason
// text the runtime writes ("message id: …", "database: …", "http: …", "id
// conflict: …", else an evaluation error).
const reasonClassSQL = `coalesce(reason_class, CASE
	WHEN reason LIKE 'message id: invalid message id%' THEN 'invalid_id'
	WHEN reason LIKE 'message id: %invalid JSON payload%' THEN 'invalid_json'
	WHEN reason LIKE 'message id: %' THEN 'missing_id'
	WHEN reason LIKE 'database: %' THEN 'database'
	WHEN reason LIKE 'http: %' THEN 'http'
	WHEN reason LIKE 'id conflict: %' THEN 'id_conflict'
	WHEN reason LIKE '%invalid JSON payload%' THEN 'invalid_json'
	ELSE 'evaluation' END)`

// deadLetterFilterSQL is the WHERE clause of a DeadLetterFilter over
// parameters $1 to $4 (deadLetterFilterArgs); $5 is the limit.
const deadLetterFilterSQL = `(cardinality($1::text[]) = 0 OR ` + reasonClassSQL + ` = ANY($1::text[]))
		  AND (cardinality($2::text[]) = 0 OR message_id = ANY($2::text[]))
		  AND ($3::timestamptz IS NULL OR dead_at >= $3)
		  AND ($4::timestamptz IS NULL OR dead_at < $4)`

// deadLetterFilterArgs are the parameters of deadLetterFilterSQL and the
// limit.
func deadLetterFilterArgs(f DeadLetterFilter) []any {
	var since, until pgtype.Timestamptz
	since.Time, since.Valid = f.Since, !f.Since.IsZero()
	until.Time, until.Valid = f.Until, !f.Until.IsZero()
	limit := pgtype.Int8{Int64: int64(f.Limit), Valid: f.Limit > 0}
	classes, ids := f.Classes, f.MessageIDs
	if classes == nil {
		classes = []string{}
	}
	if ids == nil {
		ids = []string{}
	}
	return []any{classes, ids, since, until, limit}
}

// SelectDeadLetters returns the ids of the dead-letter rows the filter
// selects, oldest first.
func (s *Store) SelectDeadLetters(ctx context.Context, q Querier, f DeadLetterFilter) ([]int64, error) {
	rows, err := q.Query(ctx, `SELECT id FROM `+s.deadLetters+` WHERE `+deadLetterFilterSQL+`
		ORDER BY id LIMIT $5`, deadLetterFilterArgs(f)...)
	if err != nil {
		return nil, fmt.Errorf("while selecting dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("while selecting dead letters: %w", err)
	}
	return out, nil
}

// StoredDeadLetter is one row of the dead-letter table.
type StoredDeadLetter struct {
	ID int64
	DeadLetter
	DeadAt time.Time
}

// LockDeadLetter reads dead letter id inside tx and locks it until tx ends.
// It returns nil when the row is gone or locked by another transaction (a
// concurrent redrive has it): SKIP LOCKED, so two redrives never wait on
// each other or settle one row twice.
func (s *Store) LockDeadLetter(ctx context.Context, tx pgx.Tx, id int64) (*StoredDeadLetter, error) {
	var d StoredDeadLetter
	var msgID, native, class *string
	var headers []byte
	var attempts *int32
	var published *time.Time
	err := tx.QueryRow(ctx, `SELECT id, message_id, native_id, reason, `+reasonClassSQL+`, payload, headers,
		attempts, published_at, dead_at FROM `+s.deadLetters+` WHERE id = $1 FOR UPDATE SKIP LOCKED`, id).Scan(
		&d.ID, &msgID, &native, &d.Reason, &class, &d.Payload, &headers, &attempts, &published, &d.DeadAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("while locking dead letter %d: %w", id, err)
	}
	d.MessageID, d.NativeID, d.Class = deref(msgID), deref(native), deref(class)
	if attempts != nil {
		d.Attempts = int(*attempts)
	}
	if published != nil {
		d.PublishedAt = *published
	}
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &d.Headers); err != nil {
			return nil, fmt.Errorf("while decoding the headers of dead letter %d: %w", id, err)
		}
	}
	return &d, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// DeleteDeadLetter removes dead letter id inside tx (it was settled).
func (s *Store) DeleteDeadLetter(ctx context.Context, tx pgx.Tx, id int64) error {
	if _, err := tx.Exec(ctx, `DELETE FROM `+s.deadLetters+` WHERE id = $1`, id); err != nil {
		return fmt.Errorf("while deleting dead letter %d: %w", id, err)
	}
	return nil
}

// FailDeadLetterAgain records inside tx that dead letter id failed once
// more: one attempt more, the new reason and class, dead_at now.
func (s *Store) FailDeadLetterAgain(ctx context.Context, tx pgx.Tx, id int64, reason, class string) error {
	_, err := tx.Exec(ctx, `UPDATE `+s.deadLetters+` SET attempts = coalesce(attempts, 0) + 1,
		reason = $2, reason_class = NULLIF($3, ''), dead_at = now() WHERE id = $1`, id, cleanText(reason), class)
	if err != nil {
		return fmt.Errorf("while recording another failure of dead letter %d: %w", id, err)
	}
	return nil
}

// Redrive is one row of <inbox>_redrives: what one run did with one dead
// letter.
type Redrive struct {
	Run          string
	DeadLetterID int64
	MessageID    string
	Outcome      string
	Reason       string
}

// RecordRedrive inserts r inside tx.
func (s *Store) RecordRedrive(ctx context.Context, tx pgx.Tx, r Redrive) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+s.redrives+` (run, dead_letter_id, message_id, outcome, reason)
		VALUES ($1, $2, NULLIF($3, ''), $4, NULLIF($5, ''))`,
		r.Run, r.DeadLetterID, cleanText(r.MessageID), r.Outcome, cleanText(r.Reason))
	if err != nil {
		return fmt.Errorf("while recording a redrive: %w", err)
	}
	return nil
}

// RedriveSummary counts the outcomes recorded for one run (several
// processes may share a run token: their rows add up).
type RedriveSummary struct {
	Run string
	// Last is the time of the run's latest row; zero when it has none.
	Last     time.Time
	Outcomes map[string]int
}

// Total is the number of dead letters the run settled or tried.
func (r RedriveSummary) Total() int {
	n := 0
	for _, v := range r.Outcomes {
		n += v
	}
	return n
}

// RedriveSummary reads the counts of run from <inbox>_redrives.
func (s *Store) RedriveSummary(ctx context.Context, run string) (RedriveSummary, error) {
	sum := RedriveSummary{Run: run, Outcomes: map[string]int{}}
	exists, err := s.tableExists(ctx, s.redrives, "the redrives log")
	if err != nil {
		return sum, err
	}
	if !exists {
		// No redrive has run on this inbox yet: the first creates the log.
		// (Asked first: with the controller's unprepared statements a
		// missing table shows only in rows.Err, after the loop.)
		return sum, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT outcome, count(*), max(redriven_at) FROM `+s.redrives+`
		WHERE run = $1 GROUP BY outcome`, run)
	if err != nil {
		return sum, fmt.Errorf("while reading redrive run %q: %w", run, err)
	}
	defer rows.Close()
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
