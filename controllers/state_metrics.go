package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/robfig/cron/v3"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// The manager's per-resource state metrics, in the style of
// kube-state-metrics' custom-resource metrics: computed at scrape time from
// the IdempotentConsumers in the manager's cache, so they exist with no
// consumer pod running (a Deployment held at 0 exports nothing) and the
// series of a deleted resource are gone at the next scrape. Labels are
// bounded: namespace and name of the resource, the condition type, its
// status and its reason (constants of the API package).
var (
	resourceLabels = []string{"namespace", "name"}

	descCondition = prometheus.NewDesc("idc_resource_condition",
		"One series per IdempotentConsumer and status condition, always 1, with the condition's status (True, False, Unknown) and reason.",
		append(resourceLabels, "condition", "status", "reason"), nil)
	descReplicasDesired = prometheus.NewDesc("idc_resource_replicas_desired",
		"Replicas the IdempotentConsumer declares (spec.runtime.replicas; 0 while spec.suspend), or under spec.runtime.autoscaling the Deployment's count as KEDA set it (status.runtime.desiredReplicas). The Deployment is held at 0 while EffectReady is False.",
		resourceLabels, nil)
	descReplicas = prometheus.NewDesc("idc_resource_replicas",
		"Replicas of the consumer Deployment (status.runtime.replicas).", resourceLabels, nil)
	descReplicasReady = prometheus.NewDesc("idc_resource_replicas_ready",
		"Ready replicas of the consumer Deployment (status.runtime.readyReplicas).", resourceLabels, nil)
	descWindow = prometheus.NewDesc("idc_resource_retention_window_seconds",
		"The retention window in force (status.retention.window); absent while it is not resolved.", resourceLabels, nil)
	descLastPrune = prometheus.NewDesc("idc_resource_last_prune_timestamp_seconds",
		"When the last prune run finished (status.lastPrune.time, Unix seconds); absent before the first run.", resourceLabels, nil)
	descPruneInterval = prometheus.NewDesc("idc_resource_prune_interval_seconds",
		"Seconds between two runs of the prune schedule (spec.retention.prune.schedule), for telling a stale prune.", resourceLabels, nil)
	descCreated = prometheus.NewDesc("idc_resource_created_timestamp_seconds",
		"When the IdempotentConsumer was created (Unix seconds).", resourceLabels, nil)
	descHeldBack = prometheus.NewDesc("idc_prune_held_back_seconds",
		"Seconds since the consumer's progress began holding pruning back (a replica stopped with claims the broker may still redeliver), as of the last prune run (status.lastPrune.heldBack); 0 when it was not held back.",
		resourceLabels, nil)
)

// stateDescs are the descriptions the state collector sends.
var stateDescs = []*prometheus.Desc{descCondition, descReplicasDesired, descReplicas, descReplicasReady, descWindow,
	descLastPrune, descPruneInterval, descCreated, descHeldBack}

// stateListTimeout bounds one scrape's read of the cache.
const stateListTimeout = 5 * time.Second

// StateCollector exports the state of every IdempotentConsumer the reader
// (the manager's cache) holds.
type StateCollector struct {
	reader client.Reader
	now    func() time.Time
}

// NewStateCollector builds the collector on reader.
func NewStateCollector(reader client.Reader) *StateCollector {
	return &StateCollector{reader: reader, now: time.Now}
}

// registerStateCollector registers the collector on controller-runtime's
// registry, which the manager's /metrics serves. A process that builds a
// second manager (tests) replaces the first one's collector.
func registerStateCollector(c *StateCollector) error {
	err := ctrlmetrics.Registry.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		ctrlmetrics.Registry.Unregister(are.ExistingCollector)
		err = ctrlmetrics.Registry.Register(c)
	}
	if err != nil {
		return fmt.Errorf("registering the state metrics: %w", err)
	}
	return nil
}

// Describe implements prometheus.Collector.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range stateDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), stateListTimeout)
	defer cancel()
	var list messagingv1alpha1.IdempotentConsumerList
	if err := c.reader.List(ctx, &list); err != nil {
		// A scrape during start-up (cache not synced) exports nothing
		// rather than a partial picture.
		log.FromContext(ctx).Error(err, "listing IdempotentConsumers for the state metrics")
		return
	}
	now := c.now()
	for i := range list.Items {
		collectResource(ch, &list.Items[i], now)
	}
}

func collectResource(ch chan<- prometheus.Metric, idc *messagingv1alpha1.IdempotentConsumer, now time.Time) {
	gauge := func(d *prometheus.Desc, v float64, extra ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{idc.Namespace, idc.Name}, extra...)...)
	}
	for _, c := range idc.Status.Conditions {
		gauge(descCondition, 1, c.Type, string(c.Status), c.Reason)
	}
	desired := specs.DesiredReplicas(idc)
	if rt := idc.Status.Runtime; idc.Spec.Runtime.Autoscaling != nil && rt != nil && rt.DesiredReplicas != nil {
		desired = *rt.DesiredReplicas
	}
	gauge(descReplicasDesired, float64(desired))
	if rt := idc.Status.Runtime; rt != nil {
		gauge(descReplicas, float64(rt.Replicas))
		gauge(descReplicasReady, float64(rt.ReadyReplicas))
	}
	if st := idc.Status.Retention; st != nil && st.Window != "" {
		if w, err := time.ParseDuration(st.Window); err == nil {
			gauge(descWindow, w.Seconds())
		}
	}
	if lp := idc.Status.LastPrune; lp != nil && lp.Time != nil {
		gauge(descLastPrune, float64(lp.Time.Unix()))
	}
	if d, ok := pruneInterval(idc.Spec.Retention.Prune.Schedule, now); ok {
		gauge(descPruneInterval, d.Seconds())
	}
	gauge(descCreated, float64(idc.CreationTimestamp.Unix()))
	gauge(descHeldBack, heldBackSeconds(idc.Status.LastPrune, now))
}

// pruneInterval is the time between the schedule's next two runs.
func pruneInterval(schedule string, now time.Time) (time.Duration, bool) {
	s, err := cron.ParseStandard(schedule)
	if err != nil {
		return 0, false
	}
	next := s.Next(now)
	after := s.Next(next)
	if next.IsZero() || after.IsZero() {
		return 0, false
	}
	return after.Sub(next), true
}
