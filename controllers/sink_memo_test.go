package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
)

// A pass a child's change wakes after a complete sink check (the
// Deployment turning available after the first pass) reuses that check: no
// statement of the checks reaches the sink database, and status is what a
// fresh check would write. After --recheck-period (so a DROP or REVOKE
// behind the controller's back is seen by the next pass), on a new
// generation or after a check that failed, the sink is checked again.
func TestSinkChecksAreReusedUntilThePeriodicPass(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.pass()
	sinkCalls := func() [3]int {
		return [3]int{h.sink.count("Ensure"), h.sink.count("CheckEffect"), h.sink.count("AdoptWindow")}
	}
	first := sinkCalls()
	if first != [3]int{1, 1, 1} {
		t.Fatalf("first pass: Ensure, CheckEffect, AdoptWindow called %v times, want once each", first)
	}
	h.markAvailable()
	h.clk.Step(DefaultRecheckPeriod / 2)
	idc, _ := h.pass()
	if got := sinkCalls(); got != first {
		t.Errorf("a pass %s after a complete check called the sink %v times in all, want %v (no new call)", DefaultRecheckPeriod/2, got, first)
	}
	if got := conditionOf(idc, messagingv1alpha1.ConditionReady); got != "True/Ready" {
		t.Fatalf("Ready = %s after a reused check, want True/Ready", got)
	}
	for _, c := range []string{messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ConditionEffectReady, messagingv1alpha1.ConditionRetentionResolved} {
		if got := meta.FindStatusCondition(idc.Status.Conditions, c); got == nil || got.Status != metav1.ConditionTrue {
			t.Errorf("%s = %v after a reused check, want True", c, got)
		}
	}
	if idc.Status.Inbox == nil || idc.Status.Retention == nil || idc.Status.Retention.Window == "" {
		t.Errorf("status.inbox %v, status.retention %v after a reused check, want both kept", idc.Status.Inbox, idc.Status.Retention)
	}

	// --recheck-period has passed since the check: the next pass checks.
	h.clk.Step(DefaultRecheckPeriod)
	h.pass()
	if got := sinkCalls(); got[0] != 2 || got[1] != 2 {
		t.Errorf("the pass after --recheck-period: the sink called %v times in all, want Ensure and CheckEffect twice", got)
	}

	// A new generation is checked at once, and a failed check is never
	// reused: each pass checks again.
	h.sink.effectErr = &sinkdb.EffectProblem{Reason: messagingv1alpha1.ReasonColumnNotFound, Message: "missing"}
	var cur messagingv1alpha1.IdempotentConsumer
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Generation++
	if err := h.c.Update(context.Background(), &cur); err != nil {
		t.Fatal(err)
	}
	h.pass()
	h.pass()
	if got := sinkCalls(); got[1] != 4 {
		t.Errorf("two passes of a new generation whose effect check fails called CheckEffect %d times in all, want 4", got[1])
	}
}

// A kept sink check is never reused past the periodic pass, even when it was
// taken after the broker reading in force (the first good pass after a
// failing one); nor while the consumer Deployment is not available; nor
// after a read of the runtime's records failed.
func TestSinkChecksAreNotReusedWhenInDoubt(t *testing.T) {
	t.Run("aged from the broker reading", func(t *testing.T) {
		h := newHarness(t, unitConsumer())
		h.sink.effectErr = &sinkdb.EffectProblem{Reason: messagingv1alpha1.ReasonColumnNotFound, Message: "missing"}
		h.pass() // reads the broker at T0; the check fails
		h.sink.effectErr = nil
		h.clk.Step(DefaultRecheckPeriod)
		h.pass() // the check passes at T0+20s, with the reading of T0
		h.markAvailable()
		ensures := h.sink.count("Ensure")
		h.clk.Step(fakePeriod - DefaultRecheckPeriod + time.Second)
		h.pass() // T0 + period + 1s: the periodic pass
		if got := h.sink.count("Ensure"); got != ensures+1 {
			t.Errorf("the periodic pass after the reading of the kept check called Ensure %d times, want once", got-ensures)
		}
	})
	t.Run("Deployment not available", func(t *testing.T) {
		h := newHarness(t, unitConsumer())
		h.pass()
		h.pass()
		if got := h.sink.count("Ensure"); got != 2 {
			t.Errorf("two passes while the Deployment is not available called Ensure %d times, want 2", got)
		}
	})
	t.Run("records unreadable", func(t *testing.T) {
		h := newHarness(t, unitConsumer())
		h.pass()
		h.markAvailable()
		h.sink.mu.Lock()
		h.sink.lastPruneErr = errors.New("connection refused")
		h.sink.mu.Unlock()
		h.pass() // reuses the check; the last prune run cannot be read
		h.pass()
		if got := h.sink.count("Ensure"); got != 2 {
			t.Errorf("after the last prune run could not be read, Ensure was called %d times in all, want 2 (checked again)", got)
		}
	})
}
