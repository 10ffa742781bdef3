package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestRuntimeResourcesDefaultOnlyWhatIsNotGiven(t *testing.T) {
	q := resource.MustParse
	tests := []struct {
		name string
		in   corev1.ResourceRequirements
		want corev1.ResourceList // requests
	}{
		{"nothing given", corev1.ResourceRequirements{}, corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceMemory: q("128Mi"), corev1.ResourceEphemeralStorage: q("128Mi")}},
		{"a cpu request keeps its value", corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("2")}},
			corev1.ResourceList{corev1.ResourceCPU: q("2"), corev1.ResourceMemory: q("128Mi"), corev1.ResourceEphemeralStorage: q("128Mi")}},
		// Kubernetes copies a limit into a missing request; a default
		// above the limit would make the pod invalid.
		{"a memory limit alone sets no memory request", corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: q("64Mi")}},
			corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceEphemeralStorage: q("128Mi")}},
		{"other resources are kept", corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceEphemeralStorage: q("1Gi")}},
			corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceMemory: q("128Mi"), corev1.ResourceEphemeralStorage: q("1Gi")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.in.DeepCopy()
			got := runtimeResources(tc.in)
			if len(got.Requests) != len(tc.want) {
				t.Fatalf("requests %v, want %v", got.Requests, tc.want)
			}
			for name, w := range tc.want {
				if g := got.Requests[name]; g.Cmp(w) != 0 {
					t.Errorf("request %s = %s, want %s", name, g.String(), w.String())
				}
			}
			if len(tc.in.Requests) != len(before.Requests) {
				t.Error("the spec's own resources were modified")
			}
		})
	}
}
