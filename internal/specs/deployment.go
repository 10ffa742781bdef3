package specs

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// appsv1DefaultDeploymentUniqueLabelKey is the label the Deployment
// controller gives each ReplicaSet's pods.
const appsv1DefaultDeploymentUniqueLabelKey = "pod-template-hash"

// DesiredReplicas is 0 while suspended, else spec.runtime.replicas.
func DesiredReplicas(idc *messagingv1alpha1.IdempotentConsumer) int32 {
	if idc.Spec.Suspend {
		return 0
	}
	if idc.Spec.Runtime.Replicas == nil {
		return 1
	}
	return *idc.Spec.Runtime.Replicas
}

// Deployment renders a consumer workload's Deployment with DesiredReplicas
// (per partition for a partitioned resource, whose pods run with
// --partition); the controller sets other replicas under autoscaling and
// while the sink cannot take the effect.
func Deployment(idc *messagingv1alpha1.IdempotentConsumer, rc *RuntimeConfig, image, secretsHash string, w Workload) *appsv1.Deployment {
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("metrics")}},
			PeriodSeconds: 10, FailureThreshold: 3,
		}
	}
	container := corev1.Container{
		Name:           "runtime",
		Command:        []string{runtimeBinary},
		Args:           runArgs(w),
		Ports:          []corev1.ContainerPort{{Name: "metrics", ContainerPort: HealthPort, Protocol: corev1.ProtocolTCP}},
		LivenessProbe:  probe("/healthz"),
		ReadinessProbe: probe("/readyz"),
	}
	l := w.labels(idc)
	spec := podSpec(idc, image, rc, container)
	if len(spec.TopologySpreadConstraints) == 0 {
		spec.TopologySpreadConstraints = defaultTopologySpread(idc, w)
	}
	// A graceful stop finishes the batch in flight before exiting.
	spec.TerminationGracePeriodSeconds = ptr.To(int64(30))
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: w.Name, Namespace: idc.Namespace, Labels: l},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(DesiredReplicas(idc)),
			Selector: &metav1.LabelSelector{MatchLabels: w.selector(idc)},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: l, Annotations: podAnnotations(idc, rc, secretsHash)},
				Spec:       spec,
			},
		},
	}
}

// defaultTopologySpread spreads the consumer replicas across nodes, softly
// (ScheduleAnyway: a one-node cluster still runs them all), per rollout
// revision (and partition). spec.runtime.topologySpreadConstraints
// replaces it.
func defaultTopologySpread(idc *messagingv1alpha1.IdempotentConsumer, w Workload) []corev1.TopologySpreadConstraint {
	return []corev1.TopologySpreadConstraint{{
		MaxSkew:           1,
		TopologyKey:       corev1.LabelHostname,
		WhenUnsatisfiable: corev1.ScheduleAnyway,
		LabelSelector:     &metav1.LabelSelector{MatchLabels: w.selector(idc)},
		MatchLabelKeys:    []string{appsv1DefaultDeploymentUniqueLabelKey},
	}}
}

// runArgs are the runtime's arguments: run with the mounted config, and
// the partition for a partition's pods.
func runArgs(w Workload) []string {
	args := configArgs("run")
	if w.Partitioned() {
		args = append(args, fmt.Sprintf("--partition=%d", w.Partition))
	}
	return args
}
