package retention

import "time"

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
