package controllers

import (
	"context"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// phase is one step of a pass. It may ask for an earlier requeue, halt the
// pass through the scope, or fail it with an error (retried with backoff).
type phase struct {
	name string
	run  func(context.Context, *scope) (ctrl.Result, error)
}

// phases are run in this order, the order a person would fix them in.
func (r *Reconciler) phases() []phase {
	return []phase{
		{"render", r.renderPhase},
		{"conflict", r.conflictPhase},
		{"secrets", r.secretsPhase},
		{"finalizer", r.finalizerPhase},
		{"inbox", r.inboxPhase},
		{"effect", r.effectPhase},
		{"broker", r.brokerPhase},
		{"retention", r.retentionPhase},
		{"children", r.childrenPhase},
		{"autoscaling", r.autoscalingPhase},
		{"workload", r.workloadPhase},
		{"last-prune", r.lastPrunePhase},
		{"outbox", r.outboxPhase},
		{"id-conflicts", r.idConflictsPhase},
		{"redrive", r.redrivePhase},
	}
}

// runPhases runs the phases until one halts the pass or fails, and returns
// the earliest requeue any asked for.
func (r *Reconciler) runPhases(ctx context.Context, s *scope) (ctrl.Result, error) {
	var res ctrl.Result
	for _, p := range r.phases() {
		start := time.Now()
		pr, err := p.run(ctx, s)
		phaseSeconds.WithLabelValues(p.name).Observe(time.Since(start).Seconds())
		if pr.RequeueAfter > 0 && (res.RequeueAfter == 0 || pr.RequeueAfter < res.RequeueAfter) {
			res.RequeueAfter = pr.RequeueAfter
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", p.name, err)
		}
		if s.halted {
			break
		}
	}
	return res, nil
}
