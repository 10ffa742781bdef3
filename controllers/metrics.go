package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
)

// The manager's controller-wide metrics. They are registered by
// RegisterMetrics, which the manager's main calls once at startup, not by
// an init function: importing the package registers nothing. (The
// per-resource state metrics are StateCollector's, registered with the
// controller in SetupWithManager.)

// brokerReads counts the manager's broker reads by source kind and outcome.
var brokerReads = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "idc_controller_broker_reads_total",
	Help: "Broker reads by the manager (window inputs, limits and lag over one connection), by source kind and result (ok, error).",
}, []string{"source", "result"})

// statusPatches counts the status writes of the manager.
var statusPatches = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "idc_controller_status_patches_total",
	Help: "Status patches the manager sent; a pass whose status did not change sends none.",
})

// childApplies counts the server-side applies of rendered children.
var childApplies = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "idc_controller_child_applies_total",
	Help: "Server-side applies of rendered children (ConfigMap, Deployment, CronJob, PodDisruptionBudget, NetworkPolicy, ScaledObject, TriggerAuthentication) by kind; a child whose rendering and live generation are unchanged is not applied.",
}, []string{"kind"})

// phaseSeconds is how long each phase of a pass takes; its help names the
// phases in the order the phase list runs them (TestPhaseMetricNamesEveryPhase).
var phaseSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "idc_controller_phase_duration_seconds",
	Help:    "Duration of each reconcile phase (render, conflict, secrets, finalizer, inbox, effect, broker, retention, children, autoscaling, workload, last-prune, outbox, id-conflicts, redrive).",
	Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
}, []string{"phase"})

// brokerLimitTooSmall is 1 while an IdempotentConsumer's broker-side limits
// cannot fill its declared replicas' batches (the BrokerLimits condition is
// False), else 0.
var brokerLimitTooSmall = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "idc_broker_limit_too_small",
	Help: "1 while the broker-side consumer limit (JetStream MaxAckPending, RabbitMQ prefetch) is below replicas x batchSize x inFlight.",
}, []string{"namespace", "name", "limit"})

// inboxLost is 1 while a resource's inbox is lost (Stalled, InboxLost).
var inboxLost = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "idc_inbox_lost",
	Help: "1 while the inbox that held an IdempotentConsumer's claims (status.inbox.epoch) is dropped, truncated or replaced: the runtime holds until a person accepts the loss (annotation messaging.idempotency.dev/accept-inbox-loss).",
}, []string{"namespace", "name"})

// resourceLag is the broker backlog the manager read for each resource, set
// at every read: the exact figure, where status.lag holds only its order of
// magnitude (statusLag).
var resourceLag = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "idc_resource_lag_messages",
	Help: "The broker's backlog for an IdempotentConsumer, as the manager read it with the window's inputs (once per --retention-period); status.lag moves only when this crosses a power of ten.",
}, []string{"namespace", "name"})

// resourcePartitionLag is resourceLag per partition of a partitioned
// resource (spec.source.natsJetStream.partitions).
var resourcePartitionLag = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "idc_resource_partition_lag_messages",
	Help: "The broker's backlog for one partition's durable consumer of a partitioned IdempotentConsumer, as the manager read it (once per --retention-period); status.partitions[].lag moves only when this crosses a power of ten.",
}, []string{"namespace", "name", "partition"})

// controllerMetrics are the collectors RegisterMetrics registers.
var controllerMetrics = []prometheus.Collector{brokerReads, statusPatches, childApplies, phaseSeconds, brokerLimitTooSmall, inboxLost, resourceLag, resourcePartitionLag}

// RegisterMetrics registers the controller-wide metrics on reg, the
// registry the manager's /metrics serves (controller-runtime's
// metrics.Registry). Call it once, at startup.
func RegisterMetrics(reg prometheus.Registerer) {
	reg.MustRegister(controllerMetrics...)
}

// DescribeMetrics sends the descriptions of every metric the manager
// exports about its work and its resources, the state collector's among
// them (test/monitoring checks the alerts against them).
func DescribeMetrics(ch chan<- *prometheus.Desc) {
	for _, c := range controllerMetrics {
		c.Describe(ch)
	}
	for _, d := range stateDescs {
		ch <- d
	}
}

// forgetResourceSeries drops the metric series of a resource that is gone.
func forgetResourceSeries(key types.NamespacedName) {
	own := prometheus.Labels{"namespace": key.Namespace, "name": key.Name}
	brokerLimitTooSmall.DeletePartialMatch(own)
	inboxLost.DeletePartialMatch(own)
	resourceLag.DeleteLabelValues(key.Namespace, key.Name)
	resourcePartitionLag.DeletePartialMatch(own)
}
