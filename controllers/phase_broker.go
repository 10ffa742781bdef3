package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/errtext"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// readingKey identifies what a reading depends on: the rendered source and
// retention spec and the referenced Secrets' data.
func readingKey(s *scope) string {
	h := sha256.New()
	_ = json.NewEncoder(h).Encode(struct {
		Source    config.Source
		Retention config.Retention
		Delivery  config.Delivery
	}{s.rc.Config.Source, s.rc.Config.Retention, s.rc.Config.Delivery})
	h.Write([]byte(s.secrets.hash))
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// brokerPhase reads the broker, or reuses the last reading while it is
// fresh. It never fails the pass: the retention phase says what a failed
// read means for the window, BrokerLimits says Unknown.
func (r *Reconciler) brokerPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	now := r.opts.Clock.Now()
	key := readingKey(s)
	if last := r.memory.reading(s.key); last != nil && last.key == key && last.dueIn(now, r.opts.RetentionPeriod, r.opts.RecheckPeriod, awaitsConsumer(s.idc)) > 0 {
		s.reading = last
	} else {
		rctx, cancel := context.WithTimeout(ctx, brokerTimeout)
		reading, err := r.opts.Broker.Observe(rctx, s.rc.Config, s.secrets.getenv, now)
		cancel()
		s.reading = &brokerReading{key: key, at: now, reading: reading, err: err}
		result := "ok"
		if s.reading.failedRead() {
			result = "error"
		}
		brokerReads.WithLabelValues(s.rc.Config.Source.Kind(), result).Inc()
		r.memory.putReading(s.key, s.reading)
	}
	observeLag(s, s.reading.reading.Lag)
	if s.reading.failedRead() {
		s.obs.brokerLimits = unknown(messagingv1alpha1.ReasonBrokerUnreachable, fmt.Sprintf("the broker was not read (%s); the limits are not known", errtext.Of(s.reading.err)))
	} else {
		observeBrokerLimits(s.idc, s.rc.Config, s.reading.reading.Result.Limits, &s.obs)
	}
	return ctrl.Result{}, nil
}
