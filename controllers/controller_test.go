package controllers

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// Once Ready, a pass over an unchanged world writes nothing: no status
// patch, no apply, no broker read until --retention-period has passed; and
// then one read that finds nothing new still writes nothing.
func TestSteadyStateWritesNothing(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.pass()
	if _, applies := h.counts(); applies != 4 {
		t.Errorf("%d applies to bring up the children, want 4 (ConfigMap, Deployment, CronJob, PodDisruptionBudget, once each)", applies)
	}
	h.markAvailable()
	// The fake client keeps no generation, so the Deployment's status
	// write looks like a change to it here (a real API server's does not).
	idc, _ := h.pass()
	if got := conditionOf(idc, messagingv1alpha1.ConditionReady); got != "True/Ready" {
		t.Fatalf("Ready = %s, want True/Ready (%s)", got, meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionReady).Message)
	}
	patches, applies := h.counts()
	reads := h.broker.readCount()
	observedAt := idc.Status.Retention.ObservedAt

	for range 5 {
		h.clk.Step(time.Minute / 2)
		h.pass()
	}
	if p, a := h.counts(); p != patches || a != applies {
		t.Errorf("steady passes wrote %d status patches and %d applies, want none", p-patches, a-applies)
	}
	if got := h.broker.readCount(); got != reads {
		t.Errorf("the broker was read %d times within --retention-period, want 0", got-reads)
	}

	h.clk.Step(fakePeriod)
	idc, requeue := h.pass()
	if got := h.broker.readCount(); got != reads+1 {
		t.Errorf("after --retention-period the broker was read %d times, want once", got-reads)
	}
	if p, a := h.counts(); p != patches || a != applies {
		t.Errorf("a broker read that found nothing new wrote %d status patches and %d applies, want none", p-patches, a-applies)
	}
	if !idc.Status.Retention.ObservedAt.Equal(observedAt) {
		t.Errorf("observedAt moved from %v to %v with unchanged inputs", observedAt, idc.Status.Retention.ObservedAt)
	}
	if requeue <= 0 || requeue > fakePeriod+fakePeriod/10 {
		t.Errorf("requeue after %s, want within --retention-period (+10%% jitter)", requeue)
	}

	// A spec change is read at once.
	idc.Spec.Source.NATSJetStream.URL = "nats://127.0.0.1:4223"
	idc.Generation++
	if err := h.c.Update(context.Background(), idc); err != nil {
		t.Fatal(err)
	}
	h.pass()
	if got := h.broker.readCount(); got != reads+2 {
		t.Errorf("a source change was read %d times, want once", got-reads-1)
	}
}
