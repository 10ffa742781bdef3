package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// WriteHeartbeat upserts the replica's progress row. Ages are the
// replica's and stored as UTC_TIMESTAMP(6) - age on the database's clock.
func (s *Inbox) WriteHeartbeat(ctx context.Context, hb inbox.Heartbeat) (err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	positions, err := json.Marshal(orEmpty(hb.Positions))
	if err != nil {
		return fmt.Errorf("while encoding progress positions: %w", err)
	}
	var consumer any
	if hb.Consumer != nil {
		b, err := json.Marshal(hb.Consumer)
		if err != nil {
			return fmt.Errorf("while encoding the consumer identity: %w", err)
		}
		consumer = string(b)
	}
	_, err = s.d.db.ExecContext(ctx, `INSERT INTO `+s.progress+`
		(replica, heartbeat_at, last_commit_at, unacked_since, positions, stopped, consumer)
		VALUES (?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, ?, ?, ?)
		ON DUPLICATE KEY UPDATE heartbeat_at = VALUES(heartbeat_at), last_commit_at = VALUES(last_commit_at),
			unacked_since = VALUES(unacked_since), positions = VALUES(positions), stopped = VALUES(stopped),
			stale_since = NULL, settle_mark = NULL, consumer = COALESCE(VALUES(consumer), consumer)`,
		hb.Replica, micros(hb.LastCommitAge), micros(hb.UnackedAge), string(positions), hb.Stopped, consumer)
	if err != nil {
		return fmt.Errorf("while writing the progress of replica %s: %w", hb.Replica, err)
	}
	return nil
}

func micros(d *time.Duration) any {
	if d == nil {
		return nil
	}
	return max(d.Microseconds(), 0)
}

func orEmpty(m map[string]int64) map[string]int64 {
	if m == nil {
		return map[string]int64{}
	}
	return m
}

// Progress returns the database's clock and every progress row, oldest
// heartbeat first.
func (s *Inbox) Progress(ctx context.Context) (_ time.Time, _ []inbox.ProgressRecord, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	now, err := dbNow(ctx, s.d.db)
	if err != nil {
		return now, nil, err
	}
	rows, err := s.d.db.QueryContext(ctx, `SELECT replica, started_at, heartbeat_at, last_commit_at, unacked_since,
		positions, stopped, stale_since, settle_mark, consumer FROM `+s.progress+` ORDER BY heartbeat_at, replica`)
	if err != nil {
		return now, nil, fmt.Errorf("while reading the replicas' progress: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []inbox.ProgressRecord
	for rows.Next() {
		var r inbox.ProgressRecord
		var lastCommit, unacked, stale sql.NullTime
		var positions []byte
		var mark, consumer sql.RawBytes
		if err := rows.Scan(&r.Replica, &r.StartedAt, &r.HeartbeatAt, &lastCommit, &unacked,
			&positions, &r.Stopped, &stale, &mark, &consumer); err != nil {
			return now, nil, fmt.Errorf("while reading the replicas' progress: %w", err)
		}
		r.LastCommitAt, r.UnackedSince, r.StaleSince = timePtr(lastCommit), timePtr(unacked), timePtr(stale)
		if err := json.Unmarshal(positions, &r.Positions); err != nil {
			return now, nil, fmt.Errorf("positions of replica %s: %w", r.Replica, err)
		}
		if mark != nil {
			if err := json.Unmarshal(mark, &r.SettleMark); err != nil {
				return now, nil, fmt.Errorf("settle mark of replica %s: %w", r.Replica, err)
			}
		}
		if consumer != nil {
			r.Consumer = &inbox.ConsumerIdentity{}
			if err := json.Unmarshal(consumer, r.Consumer); err != nil {
				return now, nil, fmt.Errorf("consumer of replica %s: %w", r.Replica, err)
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return now, nil, fmt.Errorf("while reading the replicas' progress: %w", err)
	}
	return now, out, nil
}

func timePtr(t sql.NullTime) *time.Time {
	if !t.Valid {
		return nil
	}
	v := t.Time
	return &v
}

// MarkStale records that a prune run found the replica gone and where the
// broker's delivery stood; nothing when the replica heartbeat since.
func (s *Inbox) MarkStale(ctx context.Context, rec inbox.ProgressRecord, mark map[string]int64) error {
	encoded, err := json.Marshal(orEmpty(mark))
	if err != nil {
		return fmt.Errorf("while encoding the settle mark: %w", err)
	}
	res, err := s.d.db.ExecContext(ctx, `UPDATE `+s.progress+` SET stale_since = UTC_TIMESTAMP(6), settle_mark = ?
		WHERE replica = ? AND heartbeat_at = ? AND stale_since IS NULL`, string(encoded), rec.Replica, rec.HeartbeatAt.UTC())
	if err != nil {
		return fmt.Errorf("while marking replica %s stale: %w", rec.Replica, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return inbox.ErrProgressMoved
	}
	return nil
}

// RetireProgress deletes a replica's row unless it heartbeat since rec.
func (s *Inbox) RetireProgress(ctx context.Context, rec inbox.ProgressRecord) error {
	if _, err := s.d.db.ExecContext(ctx, `DELETE FROM `+s.progress+` WHERE replica = ? AND heartbeat_at = ?`,
		rec.Replica, rec.HeartbeatAt.UTC()); err != nil {
		return fmt.Errorf("while retiring the progress of replica %s: %w", rec.Replica, err)
	}
	return nil
}

const windowColumns = `window_ms, inputs_hash, source, derived_from, redelivery_horizon, replay_horizon,
	adopted_at, pending_window_ms, pending_since, updated_at`

// ReadWindow returns the stored window state, nil when none is stored.
func (s *Inbox) ReadWindow(ctx context.Context) (*inbox.WindowState, error) {
	st, err := s.readWindow(ctx, s.d.db, "")
	if isNoSuchTable(err) {
		return nil, nil // not migrated yet
	}
	if err != nil {
		return nil, fmt.Errorf("while reading the window state of inbox %s: %w", s.name(), err)
	}
	return st, nil
}

// UpdateWindow reads the state, passes it to fn and stores what fn
// returns, in one transaction that holds the meta row's lock: two writers
// take turns even before the window row exists.
func (s *Inbox) UpdateWindow(ctx context.Context, fn func(*inbox.WindowState) (*inbox.WindowState, error)) (_ *inbox.WindowState, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	tx, err := s.d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("while updating the window state of inbox %s: %w", s.name(), err)
	}
	defer func() { _ = tx.Rollback() }()
	var one int
	if err := tx.QueryRowContext(ctx, `SELECT 1 FROM `+s.meta+` FOR UPDATE`).Scan(&one); err != nil {
		if errors.Is(err, sql.ErrNoRows) || isNoSuchTable(err) {
			return nil, inbox.ErrNoWindowTable // not migrated yet
		}
		return nil, fmt.Errorf("while taking the window lock of inbox %s: %w", s.name(), err)
	}
	current, err := s.readWindow(ctx, tx, " FOR UPDATE")
	if err != nil {
		return nil, fmt.Errorf("while reading the window state of inbox %s: %w", s.name(), err)
	}
	next, err := fn(current)
	if err != nil {
		return nil, err
	}
	if next == nil {
		return current, tx.Commit()
	}
	if next.Window <= 0 {
		return nil, fmt.Errorf("while storing the window state: window %s is not positive", next.Window)
	}
	var pendingMS, pendingSince any
	if next.PendingWindow > 0 && next.PendingSince != nil {
		pendingMS, pendingSince = ceilMillis(next.PendingWindow), next.PendingSince.UTC()
	}
	adoptedAt := next.AdoptedAt
	if adoptedAt.IsZero() {
		adoptedAt = time.Now()
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.window+` (singleton, `+windowColumns+`)
		VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6))
		ON DUPLICATE KEY UPDATE window_ms = VALUES(window_ms), inputs_hash = VALUES(inputs_hash), source = VALUES(source),
			derived_from = VALUES(derived_from), redelivery_horizon = VALUES(redelivery_horizon),
			replay_horizon = VALUES(replay_horizon), adopted_at = VALUES(adopted_at),
			pending_window_ms = VALUES(pending_window_ms), pending_since = VALUES(pending_since), updated_at = VALUES(updated_at)`,
		ceilMillis(next.Window), next.InputsHash, next.Source, next.DerivedFrom, next.RedeliveryHorizon, next.ReplayHorizon,
		adoptedAt.UTC(), pendingMS, pendingSince); err != nil {
		return nil, fmt.Errorf("while storing the window state of inbox %s: %w", s.name(), err)
	}
	out, err := s.readWindow(ctx, tx, "")
	if err != nil {
		return nil, fmt.Errorf("while reading the window state of inbox %s: %w", s.name(), err)
	}
	return out, tx.Commit()
}

func (s *Inbox) readWindow(ctx context.Context, q queryer, lock string) (*inbox.WindowState, error) {
	var st inbox.WindowState
	var windowMS int64
	var pendingMS sql.NullInt64
	var pendingSince sql.NullTime
	err := q.QueryRowContext(ctx, `SELECT `+windowColumns+` FROM `+s.window+` WHERE singleton = 1`+lock).Scan(
		&windowMS, &st.InputsHash, &st.Source, &st.DerivedFrom, &st.RedeliveryHorizon, &st.ReplayHorizon,
		&st.AdoptedAt, &pendingMS, &pendingSince, &st.UpdatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	st.Window = time.Duration(windowMS) * time.Millisecond
	if pendingMS.Valid && pendingSince.Valid {
		st.PendingWindow = time.Duration(pendingMS.Int64) * time.Millisecond
		st.PendingSince = timePtr(pendingSince)
	}
	return &st, nil
}

// ceilMillis rounds up to whole milliseconds: a stored window is never
// shorter than the one adopted.
func ceilMillis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond > 0 {
		ms++
	}
	return ms
}

// isNoSuchTable: error 1146, the table does not exist.
func isNoSuchTable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1146
}
