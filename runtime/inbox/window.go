package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// WindowState is the retention window in force and its pending shrink, as
// kept in the <inbox>_window table. It lives beside the data rather than in
// the resource's status so that a resource deleted with deletionPolicy
// Retain and applied again (or restored without status) still waits out the
// old window before a smaller one is adopted. The adoption rule itself is
// runtime/retention's; this package only stores the state.
type WindowState struct {
	// Window is the window in force.
	Window time.Duration
	// InputsHash, Source and DerivedFrom describe the derivation in force.
	InputsHash  string
	Source      string
	DerivedFrom string
	// RedeliveryHorizon and ReplayHorizon are rendered horizons ("24h",
	// "∞"); empty when the window was not derived from the broker.
	RedeliveryHorizon string
	ReplayHorizon     string
	// AdoptedAt is when the window in force was adopted.
	AdoptedAt time.Time
	// PendingWindow is the smaller window waiting to be adopted; 0 when no
	// shrink is pending.
	PendingWindow time.Duration
	// PendingSince is when the pending shrink was first observed; nil when
	// none is pending.
	PendingSince *time.Time
	// UpdatedAt is when the row was last written (set by the database).
	UpdatedAt time.Time
}

// ErrNoWindowTable is returned by UpdateWindow when the inbox has no window
// table yet (schema version < 5): Migrate creates it.
var ErrNoWindowTable = errors.New("the inbox has no window table yet (schema version < 5); migrate it first")

// windowLockClass is the second key of the advisory lock UpdateWindow takes
// (with lockKey as the first), apart from the DDL lock (0) and the outbox
// shard locks (1000+).
const windowLockClass = 2

const windowColumns = `window_ms, inputs_hash, source, derived_from, redelivery_horizon, replay_horizon,
	adopted_at, pending_window_ms, pending_since, updated_at`

// ReadWindow returns the stored window state: nil when none was stored yet,
// or when the inbox predates the window table (schema version < 5).
func (s *Store) ReadWindow(ctx context.Context) (*WindowState, error) {
	st, err := s.readWindow(ctx, s.pool, "")
	if isUndefinedTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("while reading the window state of inbox %s: %w", s.inbox, err)
	}
	return st, nil
}

// UpdateWindow reads the stored state under a row lock, passes it to fn (nil
// when none is stored) and stores what fn returns, all in one transaction,
// so the controller and the prune job never both adopt from the same stale
// state. A nil next leaves the row unchanged. It returns the state now
// stored. An error from fn rolls back and is returned as is.
func (s *Store) UpdateWindow(ctx context.Context, fn func(current *WindowState) (next *WindowState, err error)) (*WindowState, error) {
	var out *WindowState
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// FOR UPDATE locks nothing while the row does not exist yet: two
		// first writers would both see nil. The advisory lock serializes
		// them; it is held until the transaction ends.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1::int, $2::int)", s.lockKey, windowLockClass); err != nil {
			return fmt.Errorf("while taking the window lock: %w", err)
		}
		current, err := s.readWindow(ctx, tx, " FOR UPDATE")
		if isUndefinedTable(err) {
			return ErrNoWindowTable
		}
		if err != nil {
			return fmt.Errorf("while reading the window state: %w", err)
		}
		next, err := fn(current)
		if err != nil {
			return err
		}
		if next == nil {
			out = current
			return nil
		}
		if next.Window <= 0 {
			return fmt.Errorf("while storing the window state: window %s is not positive", next.Window)
		}
		if out, err = s.writeWindow(ctx, tx, next); err != nil {
			return fmt.Errorf("while storing the window state: %w", err)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrNoWindowTable) {
			return nil, err
		}
		return nil, fmt.Errorf("while updating the window state of inbox %s: %w", s.inbox, err)
	}
	return out, nil
}

func (s *Store) readWindow(ctx context.Context, q Querier, lock string) (*WindowState, error) {
	var st WindowState
	var windowMS int64
	var pendingMS *int64
	err := q.QueryRow(ctx, `SELECT `+windowColumns+` FROM `+s.window+` WHERE singleton`+lock).Scan(
		&windowMS, &st.InputsHash, &st.Source, &st.DerivedFrom, &st.RedeliveryHorizon, &st.ReplayHorizon,
		&st.AdoptedAt, &pendingMS, &st.PendingSince, &st.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	st.Window = time.Duration(windowMS) * time.Millisecond
	if pendingMS != nil && st.PendingSince != nil {
		st.PendingWindow = time.Duration(*pendingMS) * time.Millisecond
	} else {
		st.PendingSince = nil
	}
	return &st, nil
}

func (s *Store) writeWindow(ctx context.Context, tx pgx.Tx, st *WindowState) (*WindowState, error) {
	// A half-recorded shrink (a window without its start, or the reverse)
	// could never be waited out correctly: store both or neither.
	var pendingMS *int64
	var pendingSince *time.Time
	if st.PendingWindow > 0 && st.PendingSince != nil {
		ms := ceilMillis(st.PendingWindow)
		pendingMS, pendingSince = &ms, st.PendingSince
	}
	adoptedAt := st.AdoptedAt
	if adoptedAt.IsZero() {
		adoptedAt = time.Now()
	}
	row := tx.QueryRow(ctx, `INSERT INTO `+s.window+` AS w (singleton, window_ms, inputs_hash, source, derived_from,
			redelivery_horizon, replay_horizon, adopted_at, pending_window_ms, pending_since, updated_at)
		VALUES (true, $1, $2, $3, $4, $5, $6, $7, $8, $9, now())
		ON CONFLICT (singleton) DO UPDATE SET window_ms = EXCLUDED.window_ms, inputs_hash = EXCLUDED.inputs_hash,
			source = EXCLUDED.source, derived_from = EXCLUDED.derived_from,
			redelivery_horizon = EXCLUDED.redelivery_horizon, replay_horizon = EXCLUDED.replay_horizon,
			adopted_at = EXCLUDED.adopted_at, pending_window_ms = EXCLUDED.pending_window_ms,
			pending_since = EXCLUDED.pending_since, updated_at = now()
		RETURNING `+windowColumns,
		ceilMillis(st.Window), st.InputsHash, st.Source, st.DerivedFrom, st.RedeliveryHorizon, st.ReplayHorizon,
		adoptedAt, pendingMS, pendingSince)
	var out WindowState
	var windowMS int64
	var gotPending *int64
	if err := row.Scan(&windowMS, &out.InputsHash, &out.Source, &out.DerivedFrom, &out.RedeliveryHorizon, &out.ReplayHorizon,
		&out.AdoptedAt, &gotPending, &out.PendingSince, &out.UpdatedAt); err != nil {
		return nil, err
	}
	out.Window = time.Duration(windowMS) * time.Millisecond
	if gotPending != nil {
		out.PendingWindow = time.Duration(*gotPending) * time.Millisecond
	}
	return &out, nil
}

// ceilMillis rounds up to whole milliseconds (the column's unit): a stored
// window is never shorter than the one adopted, so rounding can only keep
// ids longer, never prune them early.
func ceilMillis(d time.Duration) int64 {
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond > 0 {
		ms++
	}
	return ms
}

func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}
