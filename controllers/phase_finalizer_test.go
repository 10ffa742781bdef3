package controllers

import (
	"testing"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// A spec that does not render stalls before anything is created, and gets
// no finalizer: deleting it can never wait on tables it never had.
func TestInvalidSpecStallsBeforeTheFinalizer(t *testing.T) {
	idc := unitConsumer()
	idc.Spec.Sink.Inbox.DeletionPolicy = messagingv1alpha1.DeletionPolicyDelete
	idc.Spec.Sink.Effect = messagingv1alpha1.EffectSpec{SQL: &messagingv1alpha1.SQLEffect{Statement: "UPDATE t SET n = :n", Params: map[string]messagingv1alpha1.ValueExpression{}}}
	h := newHarness(t, idc)
	got, _ := h.pass()
	if c := conditionOf(got, messagingv1alpha1.ConditionStalled); c != "True/InvalidSpec" {
		t.Fatalf("Stalled = %s, want True/InvalidSpec", c)
	}
	if len(got.Finalizers) != 0 {
		t.Fatalf("finalizers %v on a resource that never rendered", got.Finalizers)
	}
	if n := h.sink.count("Ensure"); n != 0 {
		t.Fatalf("the inbox was provisioned %d times for a spec that does not render", n)
	}
}
