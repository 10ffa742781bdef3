package controllers

import (
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// CacheOptions are the manager's cache settings: the watched namespaces,
// and for the children only the objects that carry the operator's
// managed-by label, so memory grows with the operator's own objects, not
// with the cluster's ConfigMaps, Deployments, CronJobs and Jobs. No cached
// object keeps its managedFields (nothing here reads them; with
// server-side apply they are often the largest part of an object).
func CacheOptions(namespaces map[string]cache.Config) cache.Options {
	mine := labels.SelectorFromSet(labels.Set{specs.LabelManagedBy: specs.ManagedBy})
	byObject := map[client.Object]cache.ByObject{}
	for _, obj := range []client.Object{&corev1.ConfigMap{}, &appsv1.Deployment{}, &batchv1.CronJob{}, &batchv1.Job{},
		&policyv1.PodDisruptionBudget{}, &networkingv1.NetworkPolicy{}} {
		byObject[obj] = cache.ByObject{Label: mine, Transform: slimChild}
	}
	return cache.Options{DefaultNamespaces: namespaces, ByObject: byObject, DefaultTransform: cache.TransformStripManagedFields()}
}

// slimChild drops from a cached child what the reconciler never reads: the
// managedFields, the pod templates and a ConfigMap's data. The reconciler
// reads a child's owner, labels, annotations, generation, resourceVersion,
// replicas and status; everything it writes it renders whole and applies,
// and a change someone makes to a template still moves the generation the
// reconciler compares.
func slimChild(in any) (any, error) {
	if o, ok := in.(client.Object); ok {
		o.SetManagedFields(nil)
	}
	switch o := in.(type) {
	case *appsv1.Deployment:
		o.Spec.Template = corev1.PodTemplateSpec{}
	case *batchv1.CronJob:
		o.Spec.JobTemplate = batchv1.JobTemplateSpec{}
	case *batchv1.Job:
		o.Spec.Template = corev1.PodTemplateSpec{}
	case *corev1.ConfigMap:
		o.Data, o.BinaryData = nil, nil
	}
	return in, nil
}
