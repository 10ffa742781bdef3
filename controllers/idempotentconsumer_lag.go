package controllers

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// lagTimeout bounds the lag read of one pass: a broker that does not
// answer has already cost the retention phase its timeout.
const lagTimeout = 5 * time.Second

// LagReader reads the broker's backlog for a consumer; BrokerRetention
// implements it. A RetentionDeriver without it leaves status.lag unset.
type LagReader interface {
	Lag(ctx context.Context, cfg *config.Config, getenv func(string) string) (int64, error)
}

// Lag implements LagReader with runtime/retention, the code the runtime's
// idc_source_lag_messages gauge uses.
func (BrokerRetention) Lag(ctx context.Context, cfg *config.Config, getenv func(string) string) (int64, error) {
	return retention.Lag(ctx, cfg, getenv)
}

// readLag copies the broker's backlog into status.lag (the -o wide
// column). It is informational: a failure keeps the last value and is
// logged, never fatal (BrokerUnreachable is already the retention
// condition's business).
func (r *Reconciler) readLag(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, rc *renderedConfig, secrets *resolvedSecrets) {
	lr, ok := r.opts.Retention.(LagReader)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, lagTimeout)
	defer cancel()
	n, err := lr.Lag(ctx, rc.Config, secrets.getenv)
	if err != nil {
		log.FromContext(ctx).V(1).Info("could not read the source lag", "error", err.Error())
		return
	}
	idc.Status.Lag = &n
}
