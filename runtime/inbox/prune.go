package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// PruneResult is what one prune run did.
type PruneResult struct {
	// Cutoff is what the run deleted below: WindowCutoff, or earlier when
	// the consumer's progress held it back.
	Cutoff            time.Time
	WindowCutoff      time.Time
	RowsDeleted       int64
	PartitionsDropped int
}

// Bound is what a prune run may delete: ids processed before now()-Window
// (the database's clock), and never at or after HoldAt when that is set:
// claims from then on may still come back from the broker.
type Bound struct {
	Window time.Duration
	// HoldAt caps the cutoff (zero: no cap).
	HoldAt time.Time
	// HeldReason says why HoldAt is set; HeldSince since when the hold
	// lasts. Both are recorded with the run.
	HeldReason string
	HeldSince  time.Time
}

// PruneRun is one row of <inbox>_prune_runs.
type PruneRun struct {
	ID                int64
	StartedAt         time.Time
	FinishedAt        *time.Time
	Cutoff            time.Time
	RowsDeleted       int64
	PartitionsDropped int
	Window            time.Duration
	// WindowCutoff is StartedAt - Window; Cutoff is earlier when the run
	// was held back, and HeldReason and HeldSince say why and since when.
	// They are zero for runs recorded before schema version 5.
	WindowCutoff time.Time
	HeldReason   string
	HeldSince    *time.Time
	// Error is empty for a run that succeeded.
	Error string
}

// recordTimeout bounds writing the outcome of a run whose context ended.
const recordTimeout = 10 * time.Second

// PruneTable deletes inbox rows processed before the bound's cutoff (database
// clock: the pods' clocks do not matter), batchSize rows per statement, until
// none are left or maxDuration has passed. Each batch is its own short
// transaction and skips rows a claim has locked, so pruning never blocks the
// consumer. The run is recorded in the prune-runs table, failed or not.
func (s *Store) PruneTable(ctx context.Context, b Bound, batchSize int, maxDuration time.Duration) (PruneResult, error) {
	if batchSize < 1 {
		return PruneResult{}, fmt.Errorf("while pruning: batch size must be positive, got %d", batchSize)
	}
	if s.layout == config.LayoutPartitioned {
		// ctid is only unique within one partition: the ctid-batched delete
		// would hit unrelated rows of other partitions.
		return PruneResult{}, errors.New("while pruning: a Partitioned inbox is pruned with PrunePartitions")
	}
	run, res, err := s.startRun(ctx, b)
	if err != nil {
		return res, err
	}
	deadline := time.Now().Add(maxDuration)
	stmt := `DELETE FROM ` + s.inbox + ` WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM ` + s.inbox + ` WHERE processed_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`
	for time.Now().Before(deadline) {
		tag, execErr := s.pool.Exec(ctx, stmt, res.Cutoff, batchSize)
		if execErr != nil {
			err = fmt.Errorf("while deleting a batch of inbox rows: %w", execErr)
			break
		}
		res.RowsDeleted += tag.RowsAffected()
		if tag.RowsAffected() == 0 {
			break
		}
	}
	return res, s.finishRun(ctx, run, res, err)
}

// PrunePartitions drops the day partitions whose whole range lies before
// the bound's cutoff: constant time, no row deletes, no bloat. The cutoff is
// compared with the publish day, the partition key. The run is recorded.
func (s *Store) PrunePartitions(ctx context.Context, b Bound) (PruneResult, error) {
	run, res, err := s.startRun(ctx, b)
	if err != nil {
		return res, err
	}
	parts, err := s.listPartitions(ctx)
	for _, p := range parts {
		if err != nil || p.day.AddDate(0, 0, 1).After(res.Cutoff) {
			break
		}
		err = s.dropPartition(ctx, p.name, res.Cutoff)
		switch {
		case err == nil:
			res.PartitionsDropped++
		case errors.Is(err, errPartitionInUse):
			err = nil
		}
	}
	// A dropped day must be re-created if a message of that day still shows up.
	s.partitions.reset()
	return res, s.finishRun(ctx, run, res, err)
}

// errPartitionInUse: a partition past the cutoff still holds recently
// processed ids; it is kept until they expire.
var errPartitionInUse = errors.New("partition holds ids processed after the cutoff")

func (s *Store) dropPartition(ctx context.Context, name string, cutoff time.Time) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// DROP needs an exclusive lock on the parent; waiting behind a long
		// claim would queue every new claim behind the DROP. Give up instead
		// and let the next run retry.
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
			return fmt.Errorf("while setting the lock timeout: %w", err)
		}
		// The publish day is not the processing time: a message published
		// long ago but first processed a moment ago (a backlog) sits in an
		// old partition and may still be redelivered. With claims locked out
		// (parent first, the order DROP locks in), keep a partition that
		// holds any id processed after the cutoff.
		if _, err := tx.Exec(ctx, "LOCK TABLE ONLY "+s.inbox+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			return fmt.Errorf("while locking the inbox to drop %s: %w", name, err)
		}
		part := qualify(s.names.Schema, name)
		var young bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+part+" WHERE processed_at >= $1)", cutoff).Scan(&young); err != nil {
			return fmt.Errorf("while checking partition %s for recent ids: %w", name, err)
		}
		if young {
			return errPartitionInUse
		}
		if _, err := tx.Exec(ctx, "DROP TABLE IF EXISTS "+part); err != nil {
			return fmt.Errorf("while dropping partition %s: %w", name, err)
		}
		return nil
	})
}

func (s *Store) startRun(ctx context.Context, b Bound) (int64, PruneResult, error) {
	if b.Window <= 0 {
		return 0, PruneResult{}, fmt.Errorf("while pruning: window must be positive, got %s", b.Window)
	}
	var id int64
	var res PruneResult
	var holdAt, heldSince *time.Time
	var reason *string
	if !b.HoldAt.IsZero() {
		holdAt, reason = &b.HoldAt, &b.HeldReason
		if !b.HeldSince.IsZero() {
			heldSince = &b.HeldSince
		}
	}
	// A hold at or after the window's cutoff holds nothing back: the run
	// is then recorded as not held.
	err := s.pool.QueryRow(ctx, `WITH c AS (SELECT now() - $1::bigint * interval '1 microsecond' AS window_cutoff)
		INSERT INTO `+s.pruneRuns+` (cutoff, window_cutoff, window_seconds, held_reason, held_since)
		SELECT least(c.window_cutoff, $3), c.window_cutoff, $2,
			CASE WHEN $3 < c.window_cutoff THEN $4 END, CASE WHEN $3 < c.window_cutoff THEN $5::timestamptz END FROM c
		RETURNING id, cutoff, window_cutoff`,
		b.Window.Microseconds(), int64(b.Window/time.Second), holdAt, reason, heldSince).Scan(&id, &res.Cutoff, &res.WindowCutoff)
	if err != nil {
		return 0, res, fmt.Errorf("while recording the start of a prune run: %w", err)
	}
	return id, res, nil
}

func (s *Store) finishRun(ctx context.Context, id int64, res PruneResult, runErr error) error {
	var errText *string
	if runErr != nil {
		t := runErr.Error()
		errText = &t
	}
	// Record even when ctx ended: an interrupted run is worth seeing.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	_, err := s.pool.Exec(rctx, `UPDATE `+s.pruneRuns+` SET finished_at = now(),
		rows_deleted = $2, partitions_dropped = $3, error = $4 WHERE id = $1`,
		id, res.RowsDeleted, res.PartitionsDropped, errText)
	if err != nil {
		err = fmt.Errorf("while recording the end of a prune run: %w", err)
	}
	return errors.Join(runErr, err)
}

// LastPruneRun returns the latest recorded prune run, or nil if none ran.
func (s *Store) LastPruneRun(ctx context.Context) (*PruneRun, error) {
	var r PruneRun
	var windowSeconds int64
	var errText, held *string
	var windowCutoff *time.Time
	err := s.pool.QueryRow(ctx, `SELECT id, started_at, finished_at, cutoff, rows_deleted,
		partitions_dropped, window_seconds, error, window_cutoff, held_reason, held_since
		FROM `+s.pruneRuns+` ORDER BY id DESC LIMIT 1`).Scan(
		&r.ID, &r.StartedAt, &r.FinishedAt, &r.Cutoff, &r.RowsDeleted, &r.PartitionsDropped, &windowSeconds, &errText,
		&windowCutoff, &held, &r.HeldSince)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("while reading the last prune run: %w", err)
	}
	r.Window = time.Duration(windowSeconds) * time.Second
	r.WindowCutoff = r.Cutoff
	if windowCutoff != nil {
		r.WindowCutoff = *windowCutoff
	}
	if held != nil {
		r.HeldReason = *held
	}
	if errText != nil {
		r.Error = *errText
	}
	return &r, nil
}

// Stats is a cheap snapshot of the inbox for metrics.
type Stats struct {
	// Rows is the live-row estimate from the statistics collector (exact
	// counts would scan the table).
	Rows int64
	// OldestAge is now() minus the oldest processed_at, 0 when empty.
	OldestAge time.Duration
}

// Stats reads the row estimate and the age of the oldest row (an index scan).
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	var ageSeconds float64
	err := s.pool.QueryRow(ctx, `SELECT
		(SELECT coalesce(sum(n_live_tup), 0)::bigint FROM pg_stat_user_tables
			WHERE relid = $1::regclass OR relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)),
		(SELECT coalesce(extract(epoch FROM now() - min(processed_at)), 0)::float8 FROM `+s.inbox+`)`,
		s.inbox).Scan(&st.Rows, &ageSeconds)
	if err != nil {
		return st, fmt.Errorf("while reading inbox stats: %w", err)
	}
	st.OldestAge = time.Duration(ageSeconds * float64(time.Second))
	return st, nil
}
