package specs

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// ConfigMap holds the runtime config the consumer, prune and redrive pods
// mount.
func ConfigMap(idc *messagingv1alpha1.IdempotentConsumer, rc *RuntimeConfig) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: ConfigMapName(idc), Namespace: idc.Namespace, Labels: Labels(idc, ComponentConsumer)},
		Data:       map[string]string{ConfigKey: string(rc.JSON)},
	}
}
