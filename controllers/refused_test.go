package controllers

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// A child the API server refuses as invalid (422) stalls the resource with
// InvalidSpec naming the spec field, fails no pass (no backoff loop), is
// not sent again while the spec is unchanged, and Ready says so; a changed
// spec applies again and recovers.
func TestInvalidChildStallsWithoutRetrying(t *testing.T) {
	h := newHarness(t, unitConsumer())
	var refuse atomic.Bool
	refuse.Store(true)
	var deploymentApplies atomic.Int32
	h.r.client = interceptor.NewClient(h.c.(client.WithWatch), interceptor.Funcs{
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			if u, ok := obj.(interface{ GetObjectKind() schema.ObjectKind }); ok && u.GetObjectKind().GroupVersionKind().Kind == "Deployment" {
				deploymentApplies.Add(1)
				if refuse.Load() {
					return apierrors.NewInvalid(schema.GroupKind{Group: "apps", Kind: "Deployment"}, "orders", field.ErrorList{
						field.Invalid(field.NewPath("spec", "template", "spec", "affinity", "podAntiAffinity",
							"requiredDuringSchedulingIgnoredDuringExecution").Index(0).Child("labelSelector", "matchExpressions").Index(0).Child("operator"),
							"Sometimes", "not a valid selector operator"),
					})
				}
			}
			return c.Apply(ctx, obj, opts...)
		},
	})
	for range 3 {
		idc, _ := h.pass() // fails the test on a Reconcile error
		for _, c := range []string{messagingv1alpha1.ConditionStalled, messagingv1alpha1.ConditionReady, messagingv1alpha1.ConditionRuntimeReady} {
			want := "False/" + messagingv1alpha1.ReasonInvalidSpec
			if c == messagingv1alpha1.ConditionStalled {
				want = "True/" + messagingv1alpha1.ReasonInvalidSpec
			}
			if got := conditionOf(idc, c); got != want {
				t.Fatalf("%s = %s, want %s", c, got, want)
			}
		}
		msg := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionStalled).Message
		if !strings.Contains(msg, "spec.runtime.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].operator") ||
			!strings.Contains(msg, "not a valid selector operator") {
			t.Fatalf("Stalled message %q does not name the spec field and the refusal", msg)
		}
		if idc.Status.ObservedGeneration != idc.Generation {
			t.Fatalf("observedGeneration %d, want %d (kstatus reads Stalled only then)", idc.Status.ObservedGeneration, idc.Generation)
		}
		h.clk.Step(2 * fakePeriod) // the periodic pass too
	}
	if n := deploymentApplies.Load(); n != 1 {
		t.Fatalf("the refused Deployment was applied %d times in 3 passes, want once", n)
	}

	// The spec changes (the person fixed it): applied again, and Ready.
	var idc messagingv1alpha1.IdempotentConsumer
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &idc); err != nil {
		t.Fatal(err)
	}
	idc.Spec.Runtime.PriorityClassName = "fixed"
	if err := h.c.Update(context.Background(), &idc); err != nil {
		t.Fatal(err)
	}
	refuse.Store(false)
	h.pass()
	h.markAvailable()
	got, _ := h.pass()
	if c := conditionOf(got, messagingv1alpha1.ConditionStalled); c != "False/"+messagingv1alpha1.ReasonReady {
		t.Fatalf("after the fix Stalled = %s", c)
	}
	if n := deploymentApplies.Load(); n < 2 {
		t.Fatalf("the Deployment was not applied again after the spec changed (%d applies)", n)
	}
}

func TestSpecFieldOfAChildField(t *testing.T) {
	for _, tc := range []struct{ kind, child, want string }{
		{"Deployment", "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]",
			"spec.runtime.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"},
		{"CronJob", "spec.jobTemplate.spec.template.spec.tolerations[1].effect", "spec.runtime.tolerations[1].effect"},
		{"Deployment", "spec.template.spec.nodeSelector", "spec.runtime.nodeSelector"},
		{"Deployment", "spec.template.spec.containers[0].resources.requests", "spec.runtime.resources.requests"},
		{"Deployment", "spec.template.metadata.annotations", "spec.runtime.podAnnotations"},
		{"Job", "spec.template.spec.priorityClassName", "spec.runtime.priorityClassName"},
		{"CronJob", "spec.schedule", "spec.retention.prune.schedule"},
		// Not a prefix of a longer name; unmapped fields stay the child's.
		{"Deployment", "spec.template.spec.nodeSelectorX", "spec.template.spec.nodeSelectorX"},
		{"Deployment", "spec.template.spec.containers[1].image", "spec.template.spec.containers[1].image"},
	} {
		if got := specFieldOf(tc.kind, tc.child); got != tc.want {
			t.Errorf("specFieldOf(%s, %s) = %s, want %s", tc.kind, tc.child, got, tc.want)
		}
	}
}
