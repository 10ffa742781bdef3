package sinkdb

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/errtext"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// ErrInvalidDSN marks a connection string that cannot be parsed; the parse
// error itself is not kept because it may echo the string, password
// included.
var ErrInvalidDSN = errors.New("the connection string cannot be parsed")

// InvalidDSNError is a connection string of Kind that does not parse; it
// is ErrInvalidDSN and, like it, keeps nothing of the string.
type InvalidDSNError struct{ Kind sink.Kind }

func (e *InvalidDSNError) Error() string        { return ErrInvalidDSN.Error() }
func (e *InvalidDSNError) Is(target error) bool { return target == ErrInvalidDSN }

// dsnForm is the connection string form of kind, for the message.
func dsnForm(err error) string {
	var e *InvalidDSNError
	if errors.As(err, &e) && e.Kind == sink.MySQL {
		return "user:password@tcp(host:3306)/database (go-sql-driver/mysql)"
	}
	return "postgres://user:password@host:5432/db or key=value form"
}

// EffectProblem is a sink that is not ready for the effect (or the inbox, a
// missing grant): a reason
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
// (SQLSTATE 3D000) or MySQL's unknown database (1049).
func IsDatabaseGone(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "3D000" || mysqlErrorNumber(err) == 1049
}

// Classify maps a database error to a condition reason and a message an
// on-call engineer can act on. Messages never contain the connection
// string.
func Classify(err error, ref messagingv1alpha1.SecretKeyRef) (string, string) {
	where := fmt.Sprintf("the database named by Secret %q key %q", ref.Name, ref.Key)
	if errors.Is(err, ErrInvalidDSN) {
		return messagingv1alpha1.ReasonInvalidDSN, fmt.Sprintf("the connection string in Secret %q key %q cannot be parsed; expected %s", ref.Name, ref.Key, dsnForm(err))
	}
	if errors.Is(err, ErrMigrationQueued) {
		// The database answered (the up-to-date check ran): it is busy
		// migrating other inboxes, not unreachable.
		return messagingv1alpha1.ReasonMigrationQueued, fmt.Sprintf("the inbox migration in %s is queued: %s; it runs on the next check", where, errtext.Of(err))
	}
	var p *EffectProblem
	if errors.As(err, &p) {
		return p.Reason, p.Message
	}
	if reason, msg, ok := classifyMySQL(err, ref, where); ok {
		return reason, msg
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "28"):
			// Invalid authorization (28P01 a wrong password, 28000 no such
			// role or no pg_hba.conf entry): no grant helps. PostgreSQL's
			// message names the user at most, never the password.
			return messagingv1alpha1.ReasonAuthenticationFailed, fmt.Sprintf("the sink database refused the credentials in Secret %q key %q (SQLSTATE %s: %s): check the user and password in the connection string (and pg_hba.conf)",
				ref.Name, ref.Key, pgErr.Code, errtext.Sanitize(pgErr.Message))
		case pgErr.Code == "42501":
			return messagingv1alpha1.ReasonPermissionDenied, fmt.Sprintf("permission denied on %s (SQLSTATE %s: %s); grant the role USAGE and CREATE on the schema", where, pgErr.Code, errtext.Sanitize(pgErr.Message))
		case pgErr.Code == "3D000":
			return messagingv1alpha1.ReasonDatabaseError, fmt.Sprintf("%s does not exist (SQLSTATE %s: %s)", where, pgErr.Code, errtext.Sanitize(pgErr.Message))
		}
		return messagingv1alpha1.ReasonProvisioningFailed, fmt.Sprintf("provisioning the inbox in %s failed (SQLSTATE %s: %s)", where, pgErr.Code, errtext.Sanitize(pgErr.Message))
	}
	return messagingv1alpha1.ReasonDatabaseError, fmt.Sprintf("cannot reach %s: %s; retrying with backoff", where, errtext.Of(err))
}
