package specs

import (
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// PodDisruptionBudget keeps all but one consumer replica up through
// voluntary disruptions (node drains): a consumer with more than one
// replica keeps consuming while a node is drained. One per workload (per
// partition).
func PodDisruptionBudget(idc *messagingv1alpha1.IdempotentConsumer, w Workload) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: metav1.ObjectMeta{Name: w.Name, Namespace: idc.Namespace, Labels: w.labels(idc)},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(1)),
			Selector:       &metav1.LabelSelector{MatchLabels: w.selector(idc)},
		},
	}
}
