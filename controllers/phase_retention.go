package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/errtext"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// retentionPhase resolves the window in force from the broker reading
// (s.window; 0 when unresolved: pruning is then suspended). A window that
// grows applies at once; one that shrinks waits until the old window has
// elapsed. The state that rule needs (window in force, pending shrink and
// since when) is kept in the inbox database, beside the data, and adopted
// there through the same function the prune job calls; status is a
// projection of it, so a resource re-created or restored without status
// still waits out the old window. When the broker cannot be read the last
// window stays in force, never a smaller one.
func (r *Reconciler) retentionPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	now := r.opts.Clock.Now()
	derived, err := s.reading.reading.Result, s.reading.err
	switch {
	case errors.Is(err, retention.ErrUnboundedReplay):
		// The stored state is left as it is: should replay become bounded
		// with a smaller window, that one still waits out the stored one.
		msg := fmt.Sprintf("the broker can replay without bound (%s); set spec.retention.maxReplayAge to bound it. Pruning is suspended and nothing is deleted meanwhile", derived.DerivedFrom)
		s.obs.retention = failed(messagingv1alpha1.ReasonUnboundedReplay, msg)
		// A sink a person must fix stalled the pass first and is what
		// Stalled names; RetentionResolved still says this one.
		if !s.obs.stalled.reached {
			s.obs.stalled = failed(messagingv1alpha1.ReasonUnboundedReplay, msg)
		}
		st := retentionStatus(derived, s.reading.at)
		st.Window = ""
		s.idc.Status.Retention = keepObservedAt(s.before.Status.Retention, st)
		s.window = 0
		return ctrl.Result{}, nil
	case err != nil:
		s.window = r.keepRetention(ctx, s, err)
		return ctrl.Result{}, nil
	}
	if snap := s.reused; snap != nil && snap.readingAt.Equal(s.reading.at) {
		// The window adopted from this very reading by an earlier pass of
		// this generation (the sink memo), with no shrink pending: a pending one
		// is never reused, it is due at a time, not on a reading.
		s.idc.Status.Retention = keepObservedAt(s.before.Status.Retention, snap.retention.DeepCopy())
		s.obs.retention, s.window = snap.retentionObs, snap.window
		return ctrl.Result{}, nil
	}
	next, pending, dbErr := r.opts.Sink.AdoptWindow(ctx, s.target(), derived, now)
	if dbErr != nil {
		// The inbox was reachable a moment ago (inboxPhase); rather than
		// leave the window unresolved, fall back on status, which cannot
		// see a shrink the stored state may still be waiting out, so it
		// adopts nothing smaller than it shows until the database answers.
		next, pending = adoptWithoutStore(appliedFromStatus(s.idc.Status.Retention), derived, now)
		if !pending {
			s.idc.Status.Retention = keepObservedAt(s.before.Status.Retention, retentionStatus(next.InForce, s.reading.at))
		} else {
			s.idc.Status.Retention.PendingWindow = retention.FormatDuration(next.Pending.Window)
			s.idc.Status.Retention.PendingSince = &metav1.Time{Time: next.ShrinkObservedAt}
		}
		s.obs.retention = okOutcome(reasonFor(next.InForce), retentionMessage(next, pending)+
			fmt.Sprintf("; the window state in the inbox database could not be updated (%s), so no smaller window is adopted until it can", errtext.Of(dbErr)))
		s.window = next.InForce.Window
		return ctrl.Result{}, nil
	}
	s.idc.Status.Retention = keepObservedAt(s.before.Status.Retention, projectRetention(next, s.reading.at))
	s.obs.retention = okOutcome(reasonFor(next.InForce), retentionMessage(next, pending))
	s.window = next.InForce.Window
	if s.recording != nil && !pending {
		s.recording.retention, s.recording.retentionObs, s.recording.window = s.idc.Status.Retention.DeepCopy(), s.obs.retention, s.window
		s.recording.readingAt = s.reading.at
		s.recording.done |= sinkRetention
	}
	return ctrl.Result{}, nil
}

// keepObservedAt keeps the observedAt of a status that shows the same
// inputs and window: observedAt is when the broker first reported the
// inputs as they are now, so reading an unchanged broker writes nothing.
func keepObservedAt(was, now *messagingv1alpha1.RetentionStatus) *messagingv1alpha1.RetentionStatus {
	if was == nil || now == nil || was.ObservedAt == nil || now.ObservedAt == nil {
		return now
	}
	if was.InputsHash == now.InputsHash && was.Window == now.Window && was.DerivedFrom == now.DerivedFrom {
		now.ObservedAt = was.ObservedAt
	}
	return now
}

// keepRetention handles a broker that cannot be read: the stored window
// stays in force (status's when none is stored or the database cannot be
// read), and status's when it is the larger: a window never shrinks
// without the broker saying so and the old window having elapsed.
func (r *Reconciler) keepRetention(ctx context.Context, s *scope, deriveErr error) time.Duration {
	idc := s.idc
	current := appliedFromStatus(idc.Status.Retention)
	stored, err := r.opts.Sink.StoredWindow(ctx, s.target())
	if err == nil && stored != nil && (current == nil || stored.InForce.Window >= current.InForce.Window) {
		// The inputs were not read now: observedAt stays when they last were.
		var observedAt time.Time
		if idc.Status.Retention != nil && idc.Status.Retention.ObservedAt != nil {
			observedAt = idc.Status.Retention.ObservedAt.Time
		}
		idc.Status.Retention = projectRetention(*stored, observedAt)
		current = stored
	}
	kept := "no window was resolved yet, so pruning is suspended"
	if current != nil {
		kept = "keeping the last window " + retention.FormatDuration(current.InForce.Window)
	}
	if errors.Is(deriveErr, retention.ErrNotPartitioned) {
		msg := fmt.Sprintf("the stream cannot be consumed in partitions: %s; %s", errtext.Of(deriveErr), kept)
		s.obs.retention = failed(messagingv1alpha1.ReasonStreamNotPartitioned, msg)
		// The stream's owner must act; the runtime refuses to bind meanwhile.
		if !s.obs.stalled.reached {
			s.obs.stalled = failed(messagingv1alpha1.ReasonStreamNotPartitioned, msg)
		}
	} else {
		s.obs.retention = failed(messagingv1alpha1.ReasonBrokerUnreachable, fmt.Sprintf("cannot read retention settings from the broker: %s; %s", errtext.Of(deriveErr), kept))
	}
	if current == nil {
		return 0
	}
	return current.InForce.Window
}

// adoptWithoutStore is the shrink rule on status alone, for when the inbox
// database cannot be updated: a growth applies at once, a shrink stays
// pending even once status says the old window has elapsed.
func adoptWithoutStore(current *retention.Applied, derived retention.Result, now time.Time) (retention.Applied, bool) {
	next, pending := retention.Adopt(current, derived, now)
	if current == nil || next.InForce.Window >= current.InForce.Window {
		return next, pending
	}
	d := derived
	return retention.Applied{InForce: current.InForce, Pending: &d, ShrinkObservedAt: current.ShrinkObservedAt}, true
}

func reasonFor(res retention.Result) string {
	if res.Source == retention.SourceBroker {
		return messagingv1alpha1.ReasonBrokerValues
	}
	return messagingv1alpha1.ReasonExplicit
}

func retentionMessage(a retention.Applied, pending bool) string {
	msg := fmt.Sprintf("window %s from %s", retention.FormatDuration(a.InForce.Window), a.InForce.DerivedFrom)
	if pending {
		msg += fmt.Sprintf("; a smaller window %s is adopted at %s, once the current one has elapsed",
			retention.FormatDuration(a.Pending.Window), a.ShrinkDueAt().UTC().Format(time.RFC3339))
	}
	return msg
}

// appliedFromStatus rebuilds the shrink state status.retention shows, the
// fallback when the inbox database cannot be reached.
func appliedFromStatus(st *messagingv1alpha1.RetentionStatus) *retention.Applied {
	if st == nil || st.Window == "" {
		return nil
	}
	w, err := time.ParseDuration(st.Window)
	if err != nil || w <= 0 {
		return nil
	}
	a := &retention.Applied{InForce: retention.Result{Window: w}}
	if st.PendingWindow != "" && st.PendingSince != nil {
		if pw, err := time.ParseDuration(st.PendingWindow); err == nil {
			a.Pending = &retention.Result{Window: pw}
			a.ShrinkObservedAt = st.PendingSince.Time
		}
	}
	return a
}

// projectRetention is status.retention for an Applied read from or written
// to the inbox database. observedAt zero leaves observedAt unset.
func projectRetention(a retention.Applied, observedAt time.Time) *messagingv1alpha1.RetentionStatus {
	st := retentionStatus(a.InForce, observedAt)
	if observedAt.IsZero() {
		st.ObservedAt = nil
	}
	if a.Pending != nil {
		st.PendingWindow = retention.FormatDuration(a.Pending.Window)
		st.PendingSince = &metav1.Time{Time: a.ShrinkObservedAt}
	}
	return st
}

func retentionStatus(res retention.Result, now time.Time) *messagingv1alpha1.RetentionStatus {
	st := &messagingv1alpha1.RetentionStatus{
		Window:      retention.FormatDuration(res.Window),
		Source:      messagingv1alpha1.RetentionSourceKind(res.Source),
		DerivedFrom: res.DerivedFrom,
		ObservedAt:  &metav1.Time{Time: now},
		InputsHash:  res.InputsHash,
	}
	// Explicit windows have no horizons to show.
	if res.RedeliveryHorizon != (retention.Horizon{}) || res.ReplayHorizon != (retention.Horizon{}) {
		st.RedeliveryHorizon = res.RedeliveryHorizon.String()
		st.ReplayHorizon = res.ReplayHorizon.String()
	}
	return st
}
