package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// recordTimeout bounds writing the outcome of a run whose context ended.
const recordTimeout = 10 * time.Second

// PruneTable deletes inbox rows processed before the bound's cutoff
// (database clock), batchSize per transaction, until none are left or
// maxDuration passed. Each batch selects its ids FOR UPDATE SKIP LOCKED
// (rows a claim holds are left for the next run) and deletes those ids, so
// pruning never waits for a claim and a claim waits at most for one short
// batch. The run is recorded, failed or not.
func (s *Inbox) PruneTable(ctx context.Context, b inbox.Bound, batchSize int, maxDuration time.Duration) (_ inbox.PruneResult, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	if batchSize < 1 {
		return inbox.PruneResult{}, fmt.Errorf("while pruning: batch size must be positive, got %d", batchSize)
	}
	if s.layout == config.LayoutPartitioned {
		// The ids are unique per publish day only: a Partitioned inbox
		// drops whole days.
		return inbox.PruneResult{}, errors.New("while pruning: a Partitioned inbox is pruned with PrunePartitions")
	}
	if !s.d.skipLock {
		return inbox.PruneResult{}, fmt.Errorf("while pruning: server %s has no FOR UPDATE SKIP LOCKED (MySQL 8.0+, MariaDB 10.6+)", s.d.version)
	}
	run, res, err := s.startRun(ctx, b)
	if err != nil {
		return res, err
	}
	deadline := time.Now().Add(maxDuration)
	for time.Now().Before(deadline) {
		n, batchErr := s.pruneBatch(ctx, res.Cutoff, batchSize)
		if batchErr != nil {
			err = fmt.Errorf("while deleting a batch of inbox rows: %w", batchErr)
			break
		}
		res.RowsDeleted += n
		if n == 0 {
			break
		}
	}
	return res, s.finishRun(ctx, run, res, err)
}

func (s *Inbox) pruneBatch(ctx context.Context, cutoff time.Time, batchSize int) (int64, error) {
	tx, err := s.d.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, `SELECT message_id FROM `+s.inbox+` WHERE processed_at < ?
		ORDER BY processed_at LIMIT ? FOR UPDATE SKIP LOCKED`, cutoff.UTC(), batchSize)
	if err != nil {
		return 0, err
	}
	var ids []any
	for rows.Next() {
		var id []byte
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
	res, err := tx.ExecContext(ctx, `DELETE FROM `+s.inbox+` WHERE message_id IN (`+
		strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ")+`)`, ids...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	return n, tx.Commit()
}

// startRun records the start of a run; the cutoff is the database clock
// minus the window, capped by the hold.
func (s *Inbox) startRun(ctx context.Context, b inbox.Bound) (int64, inbox.PruneResult, error) {
	var res inbox.PruneResult
	if b.Window <= 0 {
		return 0, res, fmt.Errorf("while pruning: window must be positive, got %s", b.Window)
	}
	now, err := dbNow(ctx, s.d.db)
	if err != nil {
		return 0, res, err
	}
	res.WindowCutoff = now.Add(-time.Duration(b.Window.Microseconds()) * time.Microsecond)
	res.Cutoff = res.WindowCutoff
	var reason, heldSince any
	if !b.HoldAt.IsZero() && b.HoldAt.Before(res.WindowCutoff) {
		res.Cutoff = b.HoldAt.UTC().Truncate(time.Microsecond)
		reason = b.HeldReason
		if !b.HeldSince.IsZero() {
			heldSince = b.HeldSince.UTC()
		}
	}
	r, err := s.d.db.ExecContext(ctx, `INSERT INTO `+s.pruneRuns+` (started_at, cutoff, window_cutoff, window_seconds, held_reason, held_since)
		VALUES (?, ?, ?, ?, ?, ?)`, now, res.Cutoff, res.WindowCutoff, int64(b.Window/time.Second), reason, heldSince)
	if err != nil {
		return 0, res, fmt.Errorf("while recording the start of a prune run: %w", err)
	}
	id, err := r.LastInsertId()
	if err != nil {
		return 0, res, fmt.Errorf("while recording the start of a prune run: %w", err)
	}
	return id, res, nil
}

func (s *Inbox) finishRun(ctx context.Context, id int64, res inbox.PruneResult, runErr error) error {
	var errText any
	if runErr != nil {
		errText = runErr.Error()
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	_, err := s.d.db.ExecContext(rctx, `UPDATE `+s.pruneRuns+` SET finished_at = UTC_TIMESTAMP(6),
		rows_deleted = ?, partitions_dropped = ?, error = ? WHERE id = ?`, res.RowsDeleted, res.PartitionsDropped, errText, id)
	if err != nil {
		err = fmt.Errorf("while recording the end of a prune run: %w", err)
	}
	return errors.Join(runErr, err)
}

// LastPruneRun returns the latest recorded run, nil if none ran.
func (s *Inbox) LastPruneRun(ctx context.Context) (*inbox.PruneRun, error) {
	var r inbox.PruneRun
	var windowSeconds int64
	var finished, windowCutoff, heldSince sql.NullTime
	var errText, held sql.NullString
	err := s.d.db.QueryRowContext(ctx, `SELECT id, started_at, finished_at, cutoff, rows_deleted,
		partitions_dropped, window_seconds, error, window_cutoff, held_reason, held_since
		FROM `+s.pruneRuns+` ORDER BY id DESC LIMIT 1`).Scan(
		&r.ID, &r.StartedAt, &finished, &r.Cutoff, &r.RowsDeleted, &r.PartitionsDropped, &windowSeconds, &errText,
		&windowCutoff, &held, &heldSince)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("while reading the last prune run: %w", err)
	}
	r.FinishedAt, r.HeldSince = timePtr(finished), timePtr(heldSince)
	r.Window = time.Duration(windowSeconds) * time.Second
	r.WindowCutoff = r.Cutoff
	if windowCutoff.Valid {
		r.WindowCutoff = windowCutoff.Time
	}
	r.HeldReason, r.Error = held.String, errText.String
	return &r, nil
}
