package sinkdb

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// SQLSTATE class 28 (the database refused the credentials) is its own
// reason, AuthenticationFailed, naming the Secret and key and telling to
// check the user and password: never "grant USAGE and CREATE", never the
// password. Checked on a real refusal (a role that does not exist:
// 28000) and on a wrong password (28P01, which trust authentication on
// this machine cannot produce).
func TestAuthenticationFailureIsNotAPrivilege(t *testing.T) {
	ref := messagingv1alpha1.SecretKeyRef{Name: "orders-db", Key: "dsn"}
	const password = "s3cret-pw"
	c := New()
	t.Cleanup(c.Pools().Close)
	_, real := c.Ensure(context.Background(), Target{Owner: "x",
		DSN:  "postgres://idc_no_such_role:" + password + "@127.0.0.1:5432/postgres?sslmode=disable",
		Sink: config.Sink{Schema: "public", InboxTable: "inbox_auth", Layout: config.LayoutTable}})
	if real == nil {
		t.Fatal("connecting as a role that does not exist succeeded")
	}
	for name, err := range map[string]error{
		"no such role (real)": real,
		"wrong password":      &pgconn.PgError{Severity: "FATAL", Code: "28P01", Message: `password authentication failed for user "app"`},
	} {
		reason, msg := Classify(err, ref)
		if reason != messagingv1alpha1.ReasonAuthenticationFailed {
			t.Errorf("%s: reason %s (%q), want AuthenticationFailed", name, reason, msg)
		}
		for _, want := range []string{`Secret "orders-db" key "dsn"`, "SQLSTATE 28", "check the user and password"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: message %q does not say %q", name, msg, want)
			}
		}
		for _, never := range []string{password, "GRANT", "grant", "USAGE"} {
			if strings.Contains(msg, never) {
				t.Errorf("%s: message %q contains %q", name, msg, never)
			}
		}
	}
	// A privilege refusal is still one.
	if reason, _ := Classify(&pgconn.PgError{Code: "42501", Message: "permission denied for schema s"}, ref); reason != messagingv1alpha1.ReasonPermissionDenied {
		t.Errorf("42501: reason %s, want PermissionDenied", reason)
	}
}
