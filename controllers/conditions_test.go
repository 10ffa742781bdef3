package controllers

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// Pure status functions, table-tested without a cluster.
func TestSetConditions(t *testing.T) {
	ok := func(reason string) outcome { return okOutcome(reason, "fine") }
	allGood := observation{
		secrets: ok("Ready"), inbox: ok("Provisioned"), effect: ok("Ready"), retention: ok("Broker"),
		runtime: ok("Ready"), prune: ok("Scheduled"),
	}
	tests := []struct {
		name                               string
		obs                                observation
		ready, reconciling, stalled, inbox string
	}{
		{"all good", allGood, "True/Ready", "False/Ready", "False/Ready", "True/Provisioned"},
		{"deployment not available", func() observation {
			o := allGood
			o.runtime = failed(messagingv1alpha1.ReasonDeploymentNotReady, "0/2")
			return o
		}(), "False/DeploymentNotAvailable", "True/DeploymentNotAvailable", "False/Ready", "True/Provisioned"},
		{"effect not ready holds Ready", func() observation {
			o := allGood
			o.effect = failed(messagingv1alpha1.ReasonNoUniqueKey, "no unique index")
			o.runtime = failed(messagingv1alpha1.ReasonWaitingForEffect, "held at 0")
			return o
		}(), "False/NoUniqueKey", "True/NoUniqueKey", "False/Ready", "True/Provisioned"},
		{"missing secret blocks the later phases", observation{
			secrets: failed(messagingv1alpha1.ReasonSecretNotFound, "Secret \"db\" does not exist"),
		}, "False/SecretNotFound", "True/SecretNotFound", "False/Ready", "False/SecretNotFound"},
		{"conflict stalls", observation{
			stalled: failed(messagingv1alpha1.ReasonConflict, "other owns it"),
		}, "False/Conflict", "False/Ready", "True/Conflict", "False/Conflict"},
		{"database down", observation{
			secrets: ok("Ready"), inbox: failed(messagingv1alpha1.ReasonDatabaseError, "cannot reach"),
		}, "False/DatabaseUnreachable", "True/DatabaseUnreachable", "False/Ready", "False/DatabaseUnreachable"},
		{"prune suspended on purpose is still ready", func() observation {
			o := allGood
			o.prune = failed(messagingv1alpha1.ReasonPruneSuspended, "spec")
			return o
		}(), "True/Ready", "False/Ready", "False/Ready", "True/Provisioned"},
		{"prune waiting for the window is not ready", func() observation {
			o := allGood
			o.prune = failed(messagingv1alpha1.ReasonWaitingForWindow, "no window")
			return o
		}(), "False/WaitingForRetention", "True/WaitingForRetention", "False/Ready", "True/Provisioned"},
		{"suspended runtime", func() observation {
			o := allGood
			o.runtime = ok(messagingv1alpha1.ReasonSuspended)
			return o
		}(), "True/Suspended", "False/Ready", "False/Ready", "True/Provisioned"},
		{"prune held back by the consumer's progress shows in Ready, suspended or not", func() observation {
			o := allGood
			o.runtime = ok(messagingv1alpha1.ReasonSuspended)
			o.prune = ok(messagingv1alpha1.ReasonPruneHeldBack)
			return o
		}(), "True/PruneHeldBack", "False/Ready", "False/Ready", "True/Provisioned"},
		{"a sink that is not ready wins over a held-back prune", func() observation {
			o := allGood
			o.effect = failed(messagingv1alpha1.ReasonTableNotFound, "no table")
			o.prune = ok(messagingv1alpha1.ReasonPruneHeldBack)
			return o
		}(), "False/TableNotFound", "True/TableNotFound", "False/Ready", "True/Provisioned"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			idc := &messagingv1alpha1.IdempotentConsumer{ObjectMeta: metav1.ObjectMeta{Generation: 3}}
			setConditions(idc, &tc.obs)
			got := func(typ string) string {
				c := meta.FindStatusCondition(idc.Status.Conditions, typ)
				if c == nil {
					return ""
				}
				if c.ObservedGeneration != 3 {
					t.Errorf("%s: observedGeneration %d, want 3", typ, c.ObservedGeneration)
				}
				return string(c.Status) + "/" + c.Reason
			}
			for typ, want := range map[string]string{
				messagingv1alpha1.ConditionReady: tc.ready, messagingv1alpha1.ConditionReconciling: tc.reconciling,
				messagingv1alpha1.ConditionStalled: tc.stalled, messagingv1alpha1.ConditionInboxReady: tc.inbox,
			} {
				if g := got(typ); g != want {
					t.Errorf("%s = %s, want %s", typ, g, want)
				}
			}
		})
	}
}

func TestConditionTransitionTimeOnlyMovesOnChange(t *testing.T) {
	idc := &messagingv1alpha1.IdempotentConsumer{}
	setConditions(idc, &observation{secrets: okOutcome("Ready", ""), inbox: okOutcome("Provisioned", "")})
	// Date the condition in the past instead of waiting: a pass that keeps
	// its status must keep that time, one that changes it must move it.
	past := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionInboxReady).LastTransitionTime = past
	setConditions(idc, &observation{secrets: okOutcome("Ready", ""), inbox: okOutcome("Provisioned", "again")})
	if got := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionInboxReady).LastTransitionTime; !got.Equal(&past) {
		t.Fatalf("lastTransitionTime moved without a status change: %v -> %v", past, got)
	}
	setConditions(idc, &observation{secrets: okOutcome("Ready", ""), inbox: failed(messagingv1alpha1.ReasonDatabaseError, "down")})
	if got := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionInboxReady).LastTransitionTime; got.Equal(&past) {
		t.Fatal("lastTransitionTime did not move when the status changed")
	}
}
