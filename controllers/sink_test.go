package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/apimachinery/pkg/api/meta"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// Every sink fault is re-checked within the re-check period and never
// fails the pass (so controller-runtime's backoff never grows); the faults
// only a person can fix set Stalled=True (kstatus Failed, Argo CD
// Degraded) with the condition's message, the transient ones leave the
// resource Reconciling. Recovery clears Stalled.
func TestSinkFaultsAreRecheckedAndStallOnlyForAPerson(t *testing.T) {
	unreachable := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	tests := []struct {
		name              string
		ensureErr         error
		effectErr         error
		condition, reason string
		stalled           bool
	}{
		{"inbox permission denied", &pgconn.PgError{Code: "42501", Message: "permission denied for schema projections"}, nil,
			messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ReasonPermissionDenied, true},
		{"inbox database unreachable", unreachable, nil,
			messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ReasonDatabaseError, false},
		{"inbox provisioning failed", &pgconn.PgError{Code: "53100", Message: "could not extend file"}, nil,
			messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ReasonProvisioningFailed, false},
		{"inbox connection string", fmt.Errorf("while parsing: %w", sinkdb.ErrInvalidDSN), nil,
			messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ReasonInvalidDSN, true},
		{"inbox migration queued", fmt.Errorf("%w: waited 20s", sinkdb.ErrMigrationQueued), nil,
			messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ReasonMigrationQueued, false},
		{"effect database unreachable", nil, unreachable,
			messagingv1alpha1.ConditionEffectReady, messagingv1alpha1.ReasonDatabaseError, false},
	}
	for _, reason := range []string{messagingv1alpha1.ReasonPermissionDenied, messagingv1alpha1.ReasonTableNotFound,
		messagingv1alpha1.ReasonColumnNotFound, messagingv1alpha1.ReasonColumnTypeMismatch, messagingv1alpha1.ReasonNoUniqueKey,
		messagingv1alpha1.ReasonStatementInvalid} {
		tests = append(tests, struct {
			name              string
			ensureErr         error
			effectErr         error
			condition, reason string
			stalled           bool
		}{"effect " + reason, nil, &sinkdb.EffectProblem{Reason: reason, Message: "run this"}, messagingv1alpha1.ConditionEffectReady, reason, true})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, unitConsumer())
			h.sink.ensureErr, h.sink.effectErr = tc.ensureErr, tc.effectErr
			for range 10 {
				res, err := h.r.Reconcile(context.Background(), reqFor("shop", "orders"))
				if err != nil {
					t.Fatalf("Reconcile failed (growing backoff) instead of asking for a re-check: %v", err)
				}
				if res.RequeueAfter <= 0 || res.RequeueAfter > DefaultRecheckPeriod {
					t.Fatalf("re-check after %s, want (0, %s]", res.RequeueAfter, DefaultRecheckPeriod)
				}
			}
			idc, _ := h.pass()
			if got := conditionOf(idc, tc.condition); got != "False/"+tc.reason {
				t.Fatalf("%s = %s, want False/%s", tc.condition, got, tc.reason)
			}
			wantStalled, wantReconciling := "False/Ready", "True/"+tc.reason
			if tc.stalled {
				wantStalled, wantReconciling = "True/"+tc.reason, "False/Ready"
				if msg := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionStalled).Message; msg == "" || msg == "no human action needed" {
					t.Errorf("Stalled message %q does not say what to do", msg)
				}
			}
			if got := conditionOf(idc, messagingv1alpha1.ConditionStalled); got != wantStalled {
				t.Errorf("Stalled = %s, want %s", got, wantStalled)
			}
			if got := conditionOf(idc, messagingv1alpha1.ConditionReconciling); got != wantReconciling {
				t.Errorf("Reconciling = %s, want %s", got, wantReconciling)
			}
			// kstatus reads Stalled only for an observed generation.
			if idc.Status.ObservedGeneration != idc.Generation {
				t.Errorf("observedGeneration %d, want %d", idc.Status.ObservedGeneration, idc.Generation)
			}
			h.sink.ensureErr, h.sink.effectErr = nil, nil
			h.pass()
			h.markAvailable()
			idc, _ = h.pass()
			for typ, want := range map[string]string{messagingv1alpha1.ConditionStalled: "False/Ready", messagingv1alpha1.ConditionReady: "True/Ready", tc.condition: "True/"} {
				if got := conditionOf(idc, typ); !strings.HasPrefix(got, want) {
					t.Errorf("after the fix %s = %s, want %s", typ, got, want)
				}
			}
		})
	}
}

// Stalled names the first thing a person must fix, in phase order: a sink
// that cannot take the effect before a broker that replays without bound.
func TestStalledNamesTheFirstFaultInPhaseOrder(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.sink.effectErr = &sinkdb.EffectProblem{Reason: messagingv1alpha1.ReasonNoUniqueKey, Message: "run CREATE UNIQUE INDEX"}
	h.broker.err = retention.ErrUnboundedReplay
	idc, _ := h.pass()
	for typ, want := range map[string]string{
		messagingv1alpha1.ConditionStalled:           "True/NoUniqueKey",
		messagingv1alpha1.ConditionRetentionResolved: "False/UnboundedReplay",
	} {
		if got := conditionOf(idc, typ); got != want {
			t.Errorf("%s = %s, want %s", typ, got, want)
		}
	}
	h.sink.effectErr = nil
	h.clk.Step(fakePeriod)
	idc, _ = h.pass()
	if got := conditionOf(idc, messagingv1alpha1.ConditionStalled); got != "True/UnboundedReplay" {
		t.Errorf("once the sink is fixed Stalled = %s, want True/UnboundedReplay", got)
	}
}

// Credentials the sink database refuses (SQLSTATE class 28) stall the
// resource with AuthenticationFailed: a person must fix the Secret, and
// no GRANT is suggested (it would not help).
func TestRefusedCredentialsStallWithoutAGrantHint(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.sink.ensureErr = &pgconn.PgError{Severity: "FATAL", Code: "28P01", Message: `password authentication failed for user "app"`}
	idc, _ := h.pass()
	for _, c := range []string{messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ConditionReady} {
		if got := conditionOf(idc, c); got != "False/"+messagingv1alpha1.ReasonAuthenticationFailed {
			t.Errorf("%s = %s, want False/AuthenticationFailed", c, got)
		}
	}
	if got := conditionOf(idc, messagingv1alpha1.ConditionStalled); got != "True/"+messagingv1alpha1.ReasonAuthenticationFailed {
		t.Errorf("Stalled = %s, want True/AuthenticationFailed", got)
	}
	msg := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionInboxReady).Message
	if strings.Contains(strings.ToUpper(msg), "GRANT") || !strings.Contains(msg, `Secret "db" key "dsn"`) {
		t.Errorf("InboxReady message %q: want the Secret named and no GRANT", msg)
	}
}
