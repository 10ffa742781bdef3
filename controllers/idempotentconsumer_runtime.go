package controllers

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

func runtimeImageFor(idc *messagingv1alpha1.IdempotentConsumer, defaultImage string) string {
	if idc.Spec.Runtime.Image != "" {
		return idc.Spec.Runtime.Image
	}
	return defaultImage
}

// deploymentAvailable reads the Deployment's Available condition for the
// current generation.
func deploymentAvailable(d *appsv1.Deployment) (bool, string) {
	if d == nil {
		return false, "the Deployment does not exist yet"
	}
	if d.Status.ObservedGeneration < d.Generation {
		return false, fmt.Sprintf("the Deployment controller has not observed generation %d yet", d.Generation)
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			if c.Status == corev1.ConditionTrue {
				return true, fmt.Sprintf("%d/%d replicas ready", d.Status.ReadyReplicas, ptr.Deref(d.Spec.Replicas, 1))
			}
			return false, fmt.Sprintf("Deployment not available: %s", c.Message)
		}
	}
	return false, fmt.Sprintf("waiting for the Deployment to report availability (%d/%d replicas ready)", d.Status.ReadyReplicas, ptr.Deref(d.Spec.Replicas, 1))
}
