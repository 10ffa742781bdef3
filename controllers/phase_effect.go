package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// effectPhase runs the preflight. A problem makes EffectReady False and
// Stalled True (a person must fix the sink), holds the Deployment at 0
// replicas (childrenPhase) and asks for a re-check within RecheckPeriod. A
// check that could not run (the database is unreachable) halts the pass,
// leaving the Deployment as it is, and is checked again too.
func (r *Reconciler) effectPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	if s.reused != nil {
		s.obs.effect = s.reused.effectObs
		return ctrl.Result{}, nil
	}
	err := r.opts.Sink.CheckEffect(ctx, s.target(), s.rc.Config)
	var p *sinkdb.EffectProblem
	switch {
	case err == nil:
		s.obs.effect = okOutcome(messagingv1alpha1.ReasonReady, effectReadyMessage(s.rc.Config))
		if s.recording != nil {
			s.recording.effectObs = s.obs.effect
			s.recording.done |= sinkEffect
		}
		return ctrl.Result{}, nil
	case errors.As(err, &p):
		return r.sinkFault(ctx, s, &s.obs.effect, p.Reason, p.Message), nil
	default:
		reason, msg := classifyDBError(s.idc, err)
		s.halt()
		return r.sinkFault(ctx, s, &s.obs.effect, reason, msg), nil
	}
}

func effectReadyMessage(cfg *config.Config) string {
	e := cfg.Sink.Effect
	switch {
	case e.Upsert != nil:
		return fmt.Sprintf("table %s.%s has every mapped column, a unique key on (%s) and the privileges the upsert needs", cfg.Sink.Schema, e.Upsert.Table, strings.Join(e.Upsert.Key, ", "))
	case e.Append != nil:
		return fmt.Sprintf("table %s.%s has every mapped column and the privileges the append needs", cfg.Sink.Schema, e.Append.Table)
	case e.SQL != nil:
		return "the sql statement prepares with its declared parameters and the role may run it"
	}
	return "the http effect has nothing to check in the sink database"
}
