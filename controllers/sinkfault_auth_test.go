package controllers

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"k8s.io/apimachinery/pkg/api/meta"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

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
