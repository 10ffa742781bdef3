package sinkdb

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// ErrInvalidDSN marks a connection string that cannot be parsed; the parse
// error itself is not kept because it may echo the string, password
// included.
var ErrInvalidDSN = errors.New("the connection string cannot be parsed")

// EffectProblem is a sink that is not ready for the effect: a reason
// (messagingv1alpha1.ReasonTableNotFound, ...) and a message that names the
// table and column and says what to run.
type EffectProblem struct {
	Reason  string
	Message string
}

func (p *EffectProblem) Error() string { return p.Reason + ": " + p.Message }

func problem(reason, format string, args ...any) *EffectProblem {
	return &EffectProblem{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// IsDatabaseGone says whether err is PostgreSQL's "database does not exist"
// (SQLSTATE 3D000).
func IsDatabaseGone(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "3D000"
}

// Classify maps a database error to a condition reason and a message an
// on-call engineer can act on. Messages never contain the connection
// string.
func Classify(err error, ref messagingv1alpha1.SecretKeyRef) (string, string) {
	where := fmt.Sprintf("the database named by Secret %q key %q", ref.Name, ref.Key)
	if errors.Is(err, ErrInvalidDSN) {
		return messagingv1alpha1.ReasonInvalidDSN, fmt.Sprintf("the connection string in Secret %q key %q cannot be parsed; expected postgres://user:password@host:5432/db or key=value form", ref.Name, ref.Key)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "42501" || strings.HasPrefix(pgErr.Code, "28"):
			return messagingv1alpha1.ReasonPermissionDenied, fmt.Sprintf("permission denied on %s (SQLSTATE %s: %s); grant the role CREATE on the database and schema", where, pgErr.Code, pgErr.Message)
		case pgErr.Code == "3D000":
			return messagingv1alpha1.ReasonDatabaseError, fmt.Sprintf("%s does not exist (SQLSTATE %s: %s)", where, pgErr.Code, pgErr.Message)
		}
		return messagingv1alpha1.ReasonProvisioningFailed, fmt.Sprintf("provisioning the inbox in %s failed (SQLSTATE %s: %s)", where, pgErr.Code, pgErr.Message)
	}
	return messagingv1alpha1.ReasonDatabaseError, fmt.Sprintf("cannot reach %s: %s; retrying with backoff", where, Redact(err.Error()))
}

// Redact drops anything that looks like a password from a driver message.
func Redact(s string) string {
	fields := strings.Fields(s)
	for i, f := range fields {
		if strings.HasPrefix(strings.ToLower(strings.Trim(f, "`'\"")), "password=") {
			fields[i] = "password=<redacted>"
		}
	}
	return strings.Join(fields, " ")
}
