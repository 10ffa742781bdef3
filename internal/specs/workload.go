package specs

import (
	"fmt"
	"strconv"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// LabelPartition is the partition a consumer pod serves, on the pods,
// Deployment, PodDisruptionBudget and ScaledObject of a partitioned
// resource (spec.source.natsJetStream.partitions).
const LabelPartition = "messaging.idempotency.dev/partition"

// Workload is one consumer Deployment with its PodDisruptionBudget and
// ScaledObject: the resource's one, or one partition's.
type Workload struct {
	// Partition is the partition's index, -1 for an unpartitioned resource.
	Partition int
	// Name is the Deployment's, PodDisruptionBudget's and ScaledObject's.
	Name string
	// Consumer is the JetStream durable the workload reads ("" for a
	// source that is not partitioned: the source's own consumer).
	Consumer string
}

// Partitioned says the workload is one partition's.
func (w Workload) Partitioned() bool { return w.Partition >= 0 }

// Partitions is spec.source.natsJetStream.partitions, 0 when unset.
func Partitions(idc *messagingv1alpha1.IdempotentConsumer) int {
	if j := idc.Spec.Source.NATSJetStream; j != nil && j.Partitions != nil {
		return int(*j.Partitions)
	}
	return 0
}

// Workloads are the resource's consumer workloads: one named
// DeploymentName, or one per partition named <name>-p<i> reading the
// durable <consumer>-p<i>.
func Workloads(idc *messagingv1alpha1.IdempotentConsumer) []Workload {
	n := Partitions(idc)
	if n == 0 {
		return []Workload{{Partition: -1, Name: DeploymentName(idc)}}
	}
	out := make([]Workload, n)
	for i := range n {
		out[i] = Workload{Partition: i, Name: fmt.Sprintf("%s-p%d", DeploymentName(idc), i),
			Consumer: config.PartitionConsumer(idc.Spec.Source.NATSJetStream.Consumer, i)}
	}
	return out
}

// labels are the workload's labels: the consumer's, and the partition's.
func (w Workload) labels(idc *messagingv1alpha1.IdempotentConsumer) map[string]string {
	l := Labels(idc, ComponentConsumer)
	if w.Partitioned() {
		l[LabelPartition] = strconv.Itoa(w.Partition)
	}
	return l
}

// selector is what the workload's Deployment and PodDisruptionBudget
// select: ConsumerSelector, narrowed to the partition's pods.
func (w Workload) selector(idc *messagingv1alpha1.IdempotentConsumer) map[string]string {
	sel := ConsumerSelector(idc)
	if w.Partitioned() {
		sel[LabelPartition] = strconv.Itoa(w.Partition)
	}
	return sel
}
