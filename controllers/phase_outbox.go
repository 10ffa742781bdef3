package controllers

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// outboxPhase fills status.outbox for a resource with spec.emit. It is
// informational: a failure is logged and keeps the last value.
func (r *Reconciler) outboxPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	if !s.rc.Config.UsesOutbox() {
		s.idc.Status.Outbox = nil
		return ctrl.Result{}, nil
	}
	st, err := r.opts.Sink.OutboxStats(ctx, s.target())
	if err != nil {
		_, msg := classifyDBError(s.idc, err)
		log.FromContext(ctx).Info("could not read the outbox backlog", "reason", msg)
		r.distrustSink(s)
		return ctrl.Result{}, nil
	}
	s.idc.Status.Outbox = outboxStatus(st)
	return ctrl.Result{}, nil
}

// outboxStatus is status.outbox for a backlog, the age in whole seconds.
func outboxStatus(st inbox.OutboxStats) *messagingv1alpha1.OutboxStatus {
	return &messagingv1alpha1.OutboxStatus{Pending: st.Pending, OldestAge: metav1.Duration{Duration: st.OldestAge.Truncate(time.Second)}}
}
