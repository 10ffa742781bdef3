package controllers

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
)

// While EffectReady is False the pass asks to run again within the
// re-check period (20s by default); once True, only the periodic requeue.
func TestEffectRecheckWithin30s(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.sink.effectErr = &sinkdb.EffectProblem{Reason: messagingv1alpha1.ReasonTableNotFound, Message: "missing"}
	for range 50 {
		idc, requeue := h.pass()
		if requeue <= 0 || requeue > DefaultRecheckPeriod {
			t.Fatalf("re-check after %s while EffectReady is False, want (0, %s]", requeue, DefaultRecheckPeriod)
		}
		if got := conditionOf(idc, messagingv1alpha1.ConditionEffectReady); got != "False/TableNotFound" {
			t.Fatalf("EffectReady = %s", got)
		}
	}
	var d appsv1.Deployment
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &d); err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 0 {
		t.Fatalf("replicas %d while EffectReady is False, want 0", *d.Spec.Replicas)
	}
	h.sink.effectErr = nil
	if _, requeue := h.pass(); requeue < fakePeriod/2 {
		t.Fatalf("re-check after %s once EffectReady is True, want the periodic one", requeue)
	}
}
