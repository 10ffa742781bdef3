package controllers

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
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

func TestRenderConfigIsStableAndCarriesNoCredentials(t *testing.T) {
	idc := newConsumer("orders", "ORDERS", "orders-db")
	idc.Namespace = "shop"
	idc.Spec.Delivery = messagingv1alpha1.DeliverySpec{BatchSize: 200, MaxWait: "100ms", MaxAttempts: 3,
		Backoff: messagingv1alpha1.BackoffSpec{Initial: "1s", Max: "30s"}}
	a, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := renderConfig(idc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	if a.Hash != b.Hash || string(a.JSON) != string(b.JSON) {
		t.Fatalf("rendering is not deterministic:\n%s\n%s", a.JSON, b.JSON)
	}
	c := a.Config
	if c.Sink.Effect.Upsert.SequenceColumn != "version" {
		t.Errorf("sequenceColumn defaulted to %q, want the column mapped from the entity sequence (version)", c.Sink.Effect.Upsert.SequenceColumn)
	}
	if c.Delivery.BatchSize != 200 || c.Delivery.MaxWait.Duration != 100*time.Millisecond || c.Delivery.BackoffMax.Duration != 30*time.Second {
		t.Errorf("delivery not rendered: %+v", c.Delivery)
	}
	if c.Name != "shop/orders" || c.Sink.DSNEnv != envPostgresDSN || c.Sink.DeadLetterTable != "" {
		t.Errorf("unexpected config: name %q dsnEnv %q deadLetters %q", c.Name, c.Sink.DSNEnv, c.Sink.DeadLetterTable)
	}
	if len(a.Secrets) != 1 || a.Secrets[0].Ref.Name != "orders-db" {
		t.Errorf("secrets = %+v, want the DSN Secret only", a.Secrets)
	}

	idc.Spec.Delivery.BatchSize = 300
	changed, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	if changed.Hash == a.Hash {
		t.Fatal("a spec change must change the config hash (it rolls the pods)")
	}
}

func TestPruneSuspension(t *testing.T) {
	idc := newConsumer("orders", "ORDERS", "db")
	idc.Spec.Retention.Prune.Schedule = "*/30 * * * *"
	idc.Spec.Retention.Prune.MaxDuration = "10m"
	rc, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	if cj := specs.PruneCronJob(idc, &rc.RuntimeConfig, "img", "h", 0); !*cj.Spec.Suspend {
		t.Error("an unresolved window must suspend the CronJob")
	}
	cj := specs.PruneCronJob(idc, &rc.RuntimeConfig, "img", "h", 49*time.Hour)
	if *cj.Spec.Suspend {
		t.Error("a resolved window must schedule the CronJob")
	}
	if got := cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args; got[len(got)-1] != "49h0m0s" {
		t.Errorf("args %v do not end with the window", got)
	}
	idc.Spec.Retention.Prune.Suspend = true
	if cj := specs.PruneCronJob(idc, &rc.RuntimeConfig, "img", "h", 49*time.Hour); !*cj.Spec.Suspend {
		t.Error("prune.suspend must suspend the CronJob")
	}
}

func TestLastPruneStatusHeldBack(t *testing.T) {
	finished := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	since := finished.Add(-3 * time.Hour)
	run := &inbox.PruneRun{FinishedAt: &finished, Cutoff: since.Add(-5 * time.Second), WindowCutoff: finished.Add(-time.Minute),
		RowsDeleted: 7, HeldReason: "replica r-1 stopped without acknowledging everything it committed", HeldSince: &since}
	st := lastPruneStatus(run)
	if st.HeldBack != run.HeldReason || st.HeldSince == nil || !st.HeldSince.Time.Equal(since) ||
		st.WindowCutoff == nil || !st.WindowCutoff.Time.Equal(run.WindowCutoff) || st.RowsDeleted != 7 {
		t.Fatalf("status %+v for run %+v", st, run)
	}
	if got := heldBackSeconds(st, finished.Add(time.Hour)); got != (4 * time.Hour).Seconds() {
		t.Errorf("held back %v s, want %v", got, (4 * time.Hour).Seconds())
	}
	plain := &inbox.PruneRun{FinishedAt: &finished, Cutoff: finished.Add(-time.Minute), WindowCutoff: finished.Add(-time.Minute)}
	st = lastPruneStatus(plain)
	if st.HeldBack != "" || st.HeldSince != nil || st.WindowCutoff != nil {
		t.Errorf("a run not held back shows %+v", st)
	}
	if got := heldBackSeconds(st, finished); got != 0 {
		t.Errorf("held back %v s for a run not held back", got)
	}
}
