package retention

import (
	"context"
	"fmt"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// Applied is the window in force and, while a smaller window waits, the
// pending shrink. The controller keeps it between reconciles.
type Applied struct {
	// InForce is the result whose window is in force.
	InForce Result
	// Pending is the latest smaller derivation waiting to be adopted; nil
	// when no shrink is pending.
	Pending *Result
	// ShrinkObservedAt is when a shrink was first observed; zero when none
	// is pending. Later, even smaller derivations keep this time.
	ShrinkObservedAt time.Time
}

// ShrinkDueAt is when the pending shrink will be adopted (the old window
// after it was first observed); zero when none is pending.
func (a Applied) ShrinkDueAt() time.Time {
	if a.Pending == nil {
		return time.Time{}
	}
	return a.ShrinkObservedAt.Add(a.InForce.Window)
}

// Adopt applies the shrink rule to a new derivation. A window that grows
// (or stays equal) applies at once; one that shrinks is adopted only once
// the old window has elapsed since the shrink was first observed, because
// ids recorded under the old inputs can still be redelivered or replayed
// until then. current nil means no window is in force yet: the derived one
// applies at once. pendingShrink is true while a smaller window waits. A
// derived Result without a window (Window <= 0, as returned with an error)
// changes nothing.
func Adopt(current *Applied, derived Result, now time.Time) (next Applied, pendingShrink bool) {
	if derived.Window <= 0 {
		if current == nil {
			return Applied{}, false
		}
		return *current, current.Pending != nil
	}
	if current == nil || current.InForce.Window <= 0 || derived.Window >= current.InForce.Window {
		return Applied{InForce: derived}, false
	}
	next = Applied{InForce: current.InForce, ShrinkObservedAt: current.ShrinkObservedAt}
	if current.Pending == nil || next.ShrinkObservedAt.IsZero() {
		next.ShrinkObservedAt = now
	}
	if !now.Before(next.ShrinkObservedAt.Add(current.InForce.Window)) {
		return Applied{InForce: derived}, false
	}
	d := derived
	next.Pending = &d
	return next, true
}

// WindowStore keeps the adopted window beside the data: the inbox of
// either sink database (runtime/sink.Inbox; *inbox.Store is one).
type WindowStore interface {
	ReadWindow(ctx context.Context) (*inbox.WindowState, error)
	UpdateWindow(ctx context.Context, fn func(current *inbox.WindowState) (*inbox.WindowState, error)) (*inbox.WindowState, error)
}

// AdoptStored is Adopt on the state kept in the inbox database, the one
// function through which the controller and the prune job adopt a window.
// Inside one transaction it rebuilds the Applied from the stored row (none
// stored: nothing in force yet), applies Adopt and stores the result, so a
// resource re-created without status still waits out the old window before a
// smaller one, and neither writer adopts from a state the other just
// changed. A derived Result without a window (Window <= 0) changes nothing:
// the stored state is returned as it is. pendingShrink is true while a
// smaller window waits.
func AdoptStored(ctx context.Context, store WindowStore, derived Result, now time.Time) (next Applied, pendingShrink bool, err error) {
	// The row keeps whole milliseconds and microsecond timestamps. Adopting
	// at that precision keeps a re-read row equal to what was adopted: a
	// window of 49h+0.3ms stored as 49h+1ms would otherwise look like a
	// shrink on the next call, and a start truncated on storage would let a
	// shrink be adopted a fraction early.
	now = now.Truncate(time.Microsecond)
	if derived.Window > 0 {
		derived.Window = ceilMillisecond(derived.Window)
	} else {
		current, err := StoredApplied(ctx, store)
		if err != nil {
			return Applied{}, false, err
		}
		next, pendingShrink = Adopt(current, derived, now)
		return next, pendingShrink, nil
	}
	_, err = store.UpdateWindow(ctx, func(st *inbox.WindowState) (*inbox.WindowState, error) {
		next, pendingShrink = Adopt(appliedFromState(st), derived, now)
		want := stateFromApplied(next, st, now)
		if st != nil && sameWindowState(*st, *want) {
			// Unchanged: no write, so updated_at says when it last changed.
			return nil, nil
		}
		return want, nil
	})
	if err != nil {
		return Applied{}, false, fmt.Errorf("while adopting the retention window: %w", err)
	}
	return next, pendingShrink, nil
}

// StoredApplied reads the stored window state without changing it (for when
// the broker cannot be read): nil when none is stored yet.
func StoredApplied(ctx context.Context, store WindowStore) (*Applied, error) {
	st, err := store.ReadWindow(ctx)
	if err != nil {
		return nil, fmt.Errorf("while reading the stored retention window: %w", err)
	}
	return appliedFromState(st), nil
}

// appliedFromState rebuilds the Applied a stored row describes; nil when
// none is stored. The pending shrink keeps only its window: the next
// derivation replaces it anyway, and only its window and start matter for
// the rule. ObservedAt stays zero: the row does not say when the inputs in
// force were last read.
func appliedFromState(st *inbox.WindowState) *Applied {
	if st == nil || st.Window <= 0 {
		return nil
	}
	a := &Applied{InForce: Result{
		Window:            st.Window,
		InputsHash:        st.InputsHash,
		Source:            SourceKind(st.Source),
		DerivedFrom:       st.DerivedFrom,
		RedeliveryHorizon: parseHorizon(st.RedeliveryHorizon),
		ReplayHorizon:     parseHorizon(st.ReplayHorizon),
	}}
	if st.PendingWindow > 0 && st.PendingSince != nil {
		a.Pending = &Result{Window: st.PendingWindow}
		a.ShrinkObservedAt = *st.PendingSince
	}
	return a
}

// stateFromApplied is the row for an Applied. adopted_at moves only when the
// window in force (or its inputs) changed, so it says since when that
// window has applied.
func stateFromApplied(a Applied, prev *inbox.WindowState, now time.Time) *inbox.WindowState {
	in := a.InForce
	st := &inbox.WindowState{
		Window:            in.Window,
		InputsHash:        in.InputsHash,
		Source:            string(in.Source),
		DerivedFrom:       in.DerivedFrom,
		RedeliveryHorizon: horizonText(in.RedeliveryHorizon),
		ReplayHorizon:     horizonText(in.ReplayHorizon),
		AdoptedAt:         now,
	}
	if prev != nil && prev.Window == in.Window && prev.InputsHash == in.InputsHash {
		st.AdoptedAt = prev.AdoptedAt
	}
	if a.Pending != nil {
		since := a.ShrinkObservedAt
		st.PendingWindow = a.Pending.Window
		st.PendingSince = &since
	}
	return st
}

func sameWindowState(a, b inbox.WindowState) bool {
	samePending := (a.PendingSince == nil) == (b.PendingSince == nil) &&
		(a.PendingSince == nil || a.PendingSince.Equal(*b.PendingSince))
	return samePending && a.PendingWindow == b.PendingWindow && a.Window == b.Window &&
		a.InputsHash == b.InputsHash && a.Source == b.Source && a.DerivedFrom == b.DerivedFrom &&
		a.RedeliveryHorizon == b.RedeliveryHorizon && a.ReplayHorizon == b.ReplayHorizon &&
		a.AdoptedAt.Equal(b.AdoptedAt)
}

// horizonText renders a horizon for the row; "" for none (Explicit mode),
// as status shows it.
func horizonText(h Horizon) string {
	if h == (Horizon{}) {
		return ""
	}
	return h.String()
}

// parseHorizon reads horizonText back. The horizons are shown, never used to
// decide, so text that does not parse reads as none.
func parseHorizon(s string) Horizon {
	switch s {
	case "":
		return Horizon{}
	case Infinite().String():
		return Infinite()
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return Horizon{}
	}
	return Finite(d)
}

func ceilMillisecond(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r > 0 {
		return d - r + time.Millisecond
	}
	return d
}
