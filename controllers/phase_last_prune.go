package controllers

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// lastPrunePhase copies the latest prune run recorded in the database into
// status.lastPrune and, when that run was held back by the consumer's
// progress, says so in PruneScheduled (and so in Ready's reason) and in
// idc_prune_held_back_seconds (StateCollector). Reading it is informational: a failure is
// logged, not fatal.
func (r *Reconciler) lastPrunePhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	idc, obs := s.idc, &s.obs
	run, err := r.opts.Sink.LastPrune(ctx, s.target())
	if err != nil {
		_, msg := classifyDBError(idc, err)
		log.FromContext(ctx).Info("could not read the last prune run", "reason", msg)
		r.distrustSink(s)
		return ctrl.Result{}, nil
	}
	if olderThanRecorded(run, idc.Status.LastPrune) && statusEpoch(idc) != "" {
		// The inbox is older than what this resource recorded of it: a
		// restore from an earlier backup lost the claims made since. Mark
		// it lost in the database, where every runtime's guard sees it;
		// the next pass reports InboxLost.
		if err := r.opts.Sink.MarkRestored(ctx, s.target(), statusEpoch(idc)); err != nil {
			return ctrl.Result{}, err
		}
		log.FromContext(ctx).Info("the inbox is older than the last prune run recorded in status; marked lost",
			"recordedPrune", idc.Status.LastPrune.Time.UTC().Format(time.RFC3339))
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	idc.Status.LastPrune = lastPruneStatus(run)
	if heldBackSeconds(idc.Status.LastPrune, r.opts.Clock.Now()) > 0 && obs.prune.ok {
		obs.prune = okOutcome(messagingv1alpha1.ReasonPruneHeldBack, fmt.Sprintf(
			"the last prune run (%s) kept ids its window would have deleted: %s",
			idc.Status.LastPrune.Time.UTC().Format(time.RFC3339), idc.Status.LastPrune.HeldBack))
	}
	return ctrl.Result{}, nil
}

// olderThanRecorded: the inbox's latest prune run is from before the one
// status recorded (or it has none any more), so the inbox was restored from
// an earlier backup. Status keeps the finish time to the second.
func olderThanRecorded(run *inbox.PruneRun, recorded *messagingv1alpha1.PruneRunStatus) bool {
	if recorded == nil || recorded.Time == nil {
		return false
	}
	switch {
	case run == nil:
		return true
	case run.FinishedAt != nil:
		return run.FinishedAt.Truncate(time.Second).Before(recorded.Time.Time)
	default:
		return run.StartedAt.Truncate(time.Second).Before(recorded.Time.Time)
	}
}

// heldBackSeconds is the hold's age for the metric: from heldSince to now,
// at least 1 while a run was held back.
func heldBackSeconds(st *messagingv1alpha1.PruneRunStatus, now time.Time) float64 {
	if st == nil || st.HeldBack == "" {
		return 0
	}
	if st.HeldSince == nil {
		return 1
	}
	return max(now.Sub(st.HeldSince.Time).Seconds(), 1)
}

// lastPruneStatus is status.lastPrune for a recorded run; runs still going
// or never run leave it empty.
func lastPruneStatus(run *inbox.PruneRun) *messagingv1alpha1.PruneRunStatus {
	if run == nil || run.FinishedAt == nil {
		return nil
	}
	finished := metav1.NewTime(run.FinishedAt.UTC())
	cutoff := metav1.NewTime(run.Cutoff.UTC())
	st := &messagingv1alpha1.PruneRunStatus{
		Time: &finished, Cutoff: &cutoff, RowsDeleted: run.RowsDeleted, PartitionsDropped: int32(run.PartitionsDropped),
	}
	if !run.WindowCutoff.IsZero() && !run.WindowCutoff.Equal(run.Cutoff) {
		wc := metav1.NewTime(run.WindowCutoff.UTC())
		st.WindowCutoff = &wc
	}
	if run.HeldReason != "" {
		st.HeldBack = run.HeldReason
		if run.HeldSince != nil {
			hs := metav1.NewTime(run.HeldSince.UTC())
			st.HeldSince = &hs
		}
	}
	return st
}
