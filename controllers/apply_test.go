package controllers

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// A Deployment edited behind the operator's back is applied again.
func TestDriftedChildIsAppliedAgain(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.pass()
	var d appsv1.Deployment
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &d); err != nil {
		t.Fatal(err)
	}
	d.Spec.Replicas = ptr.To(int32(9))
	d.Generation++
	if err := h.c.Update(context.Background(), &d); err != nil {
		t.Fatal(err)
	}
	_, before := h.counts()
	h.pass()
	if _, after := h.counts(); after != before+1 {
		t.Fatalf("%d applies after the Deployment drifted, want 1", after-before)
	}
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &d); err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 2 {
		t.Fatalf("replicas %d after the re-apply, want 2", *d.Spec.Replicas)
	}
}

// A child of the same name that someone else owns stalls the pass with
// Conflict, and nothing after it runs: no redrive Job is created.
func TestChildConflictStopsThePass(t *testing.T) {
	idc := unitConsumer()
	idc.Annotations = map[string]string{messagingv1alpha1.AnnotationRedrive: "t-1"}
	squatter := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "orders-runtime", Namespace: "shop"}}
	h := newHarness(t, idc, squatter)
	got, _ := h.pass()
	if c := conditionOf(got, messagingv1alpha1.ConditionStalled); c != "True/Conflict" {
		t.Fatalf("Stalled = %s, want True/Conflict", c)
	}
	var jobs batchv1.JobList
	if err := h.c.List(context.Background(), &jobs, client.InNamespace("shop")); err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) != 0 {
		t.Fatalf("%d Jobs created after a conflict, want none", len(jobs.Items))
	}
	if _, applies := h.counts(); applies != 0 {
		t.Fatalf("%d applies after a conflict on the first child, want none", applies)
	}
}

// countingReader counts the Gets of the kinds a resource's children are.
type countingReader struct {
	client.Reader
	gets *int
}

func (r countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	switch obj.(type) {
	case *corev1.ConfigMap, *appsv1.Deployment, *batchv1.CronJob, *policyv1.PodDisruptionBudget:
		*r.gets++
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// A new resource's children are created by one create-only apply each,
// without a read from the API server before it (a GET answered 404 per
// child otherwise): the cache holds none of them, and the apply itself
// tells "none exists" from "another owner's exists".
func TestNewChildrenAreNotReadBeforeTheirApply(t *testing.T) {
	h := newHarness(t, unitConsumer())
	liveGets := 0
	h.r.live = countingReader{Reader: h.c, gets: &liveGets}
	h.pass()
	if _, applies := h.counts(); applies != 4 {
		t.Fatalf("%d applies to bring up the children, want 4 (once each)", applies)
	}
	if liveGets != 0 {
		t.Fatalf("%d children read from the API server before their first apply, want none", liveGets)
	}
	var cm corev1.ConfigMap
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders-runtime"}, &cm); err != nil {
		t.Fatal(err)
	}
	if !metav1.IsControlledBy(&cm, unitConsumer()) {
		t.Fatalf("the ConfigMap is not controlled by its resource: %v", cm.OwnerReferences)
	}
}
