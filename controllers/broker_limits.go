package controllers

import (
	"fmt"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// limitCheck is one broker-side limit held against what the declared scale
// needs.
type limitCheck struct {
	name   string // metric label: max_ack_pending, prefetch
	have   int
	needed int
	fix    string
}

// brokerLimitChecks lists the limits that apply to the source. JetStream
// MaxAckPending is shared by all replicas; RabbitMQ prefetch is per replica
// (one channel each). Kafka and Redis Streams have no such cap: the runtime
// asks for batchSize records per poll/XREADGROUP COUNT itself.
func brokerLimitChecks(cfg *config.Config, limits retention.ConsumerLimits) []limitCheck {
	d := cfg.Delivery
	var out []limitCheck
	if j := cfg.Source.NATSJetStream; j != nil {
		out = append(out, limitCheck{
			name: "max_ack_pending", have: limits.MaxAckPending, needed: d.MinUnacked(d.Replicas),
			fix: fmt.Sprintf("JetStream consumer %s on stream %s has MaxAckPending=%d, below replicas (%d) x batchSize (%d) x inFlight (%d) = %d, so replicas wait for acknowledgements instead of fetching; raise it (nats consumer edit %s %s --max-pending %d) or delete the consumer so the runtime creates one sized for the declared scale",
				j.Consumer, j.Stream, limits.MaxAckPending, d.Replicas, d.BatchSize, d.InFlight, d.MinUnacked(d.Replicas), j.Stream, j.Consumer, d.SizedUnacked(d.Replicas)),
		})
	}
	if r := cfg.Source.RabbitMQ; r != nil {
		out = append(out, limitCheck{
			name: "prefetch", have: r.Prefetch, needed: d.MinUnacked(1),
			fix: fmt.Sprintf("spec.source.rabbitmq.prefetch=%d is below batchSize (%d) x inFlight (%d) = %d, so each replica's batches cannot fill; raise it or remove it (default %d)",
				r.Prefetch, d.BatchSize, d.InFlight, d.MinUnacked(1), min(d.SizedUnacked(1), 65535)),
		})
	}
	return out
}

// tooSmall: zero or negative is unlimited (or not known yet).
func (c limitCheck) tooSmall() bool { return c.have > 0 && c.have < c.needed }

// brokerLimitsOutcome is the BrokerLimits condition. Pure.
func brokerLimitsOutcome(cfg *config.Config, limits retention.ConsumerLimits) outcome {
	for _, c := range brokerLimitChecks(cfg, limits) {
		if c.tooSmall() {
			return failed(messagingv1alpha1.ReasonBrokerLimitTooSmall, c.fix)
		}
	}
	return okOutcome(messagingv1alpha1.ReasonLimitsFit, fmt.Sprintf("broker-side limits hold replicas (%d) x batchSize (%d) x inFlight (%d)",
		cfg.Delivery.Replicas, cfg.Delivery.BatchSize, cfg.Delivery.InFlight))
}

// observeBrokerLimits sets the BrokerLimits outcome and the metric.
func observeBrokerLimits(idc *messagingv1alpha1.IdempotentConsumer, cfg *config.Config, limits retention.ConsumerLimits, obs *observation) {
	obs.brokerLimits = brokerLimitsOutcome(cfg, limits)
	for _, c := range brokerLimitChecks(cfg, limits) {
		v := 0.0
		if c.tooSmall() {
			v = 1
		}
		brokerLimitTooSmall.WithLabelValues(idc.Namespace, idc.Name, c.name).Set(v)
	}
}
