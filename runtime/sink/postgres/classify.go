package postgres

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// sqlStateRule maps a SQLSTATE (5 characters) or class (its first 2) to a
// class. The first rule whose code is a prefix of the SQLSTATE wins,
// so exact codes come before their class.
type sqlStateRule struct {
	code   string
	class  sink.Class
	reason string // ClassSink only
}

// sqlStateRules is the one list of how database errors are treated
// (https://www.postgresql.org/docs/current/errcodes-appendix.html). A
// SQLSTATE matching no rule is ClassMessages.
var sqlStateRules = []sqlStateRule{
	// The sink is wrong: class 42 (syntax error or access rule violation)
	// is raised when a statement is parsed, planned or checked, before any
	// value of a message is read, so no message can cause it.
	{code: "42P01", class: sink.ClassSink, reason: sink.ReasonUndefinedTable},
	{code: "3F000", class: sink.ClassSink, reason: sink.ReasonUndefinedTable}, // invalid schema name
	{code: "42703", class: sink.ClassSink, reason: sink.ReasonUndefinedColumn},
	{code: "42P10", class: sink.ClassSink, reason: sink.ReasonNoUniqueConstraint}, // no unique constraint matching ON CONFLICT
	{code: "42501", class: sink.ClassSink, reason: sink.ReasonInsufficientPrivilege},
	{code: "42601", class: sink.ClassSink, reason: sink.ReasonInvalidStatement}, // syntax; also "cannot insert multiple commands into a prepared statement"
	{code: "42704", class: sink.ClassSink, reason: sink.ReasonUndefinedObject},
	{code: "42883", class: sink.ClassSink, reason: sink.ReasonUndefinedObject}, // undefined function or operator
	{code: "42", class: sink.ClassSink, reason: sink.ReasonInvalidStatement},
	{code: "25006", class: sink.ClassSink, reason: sink.ReasonReadOnly}, // read-only SQL transaction (a standby, default_transaction_read_only)
	{code: "0A000", class: sink.ClassSink, reason: sink.ReasonInvalidStatement},
	{code: "28", class: sink.ClassSink, reason: sink.ReasonAuthentication}, // invalid authorization (wrong password, role gone)
	{code: "3D000", class: sink.ClassSink, reason: sink.ReasonUndefinedDatabase},
	// The database is unavailable: connection exceptions (08), operator
	// intervention (57P01 admin shutdown / pg_terminate_backend, 57P02 crash
	// shutdown, 57P03 cannot connect now), insufficient resources (53: disk
	// full, out of memory, too many connections) and rollbacks caused by
	// other transactions (40001 serialization failure, 40P01 deadlock).
	{code: "08", class: sink.ClassUnavailable},
	{code: "53", class: sink.ClassUnavailable},
	{code: "57P01", class: sink.ClassUnavailable},
	{code: "57P02", class: sink.ClassUnavailable},
	{code: "57P03", class: sink.ClassUnavailable},
	{code: "40001", class: sink.ClassUnavailable},
	{code: "40P01", class: sink.ClassUnavailable},
	// A value does not fit: the message that carries it is dead-lettered.
	{code: "22", class: sink.ClassData},
	{code: "23", class: sink.ClassData},
}

// ClassifySQLState returns the class of a SQLSTATE and, for ClassSink, the
// reason.
func ClassifySQLState(code string) (sink.Class, string) {
	for _, r := range sqlStateRules {
		if strings.HasPrefix(code, r.code) {
			return r.class, r.reason
		}
	}
	return sink.ClassMessages, ""
}

// Classify says what an error of a PostgreSQL transaction means; reason is
// set for ClassSink. (runtime/consumer checks an inbox loss first.)
func Classify(err error) (sink.Class, string) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return ClassifySQLState(pgErr.Code)
	}
	if isNetworkError(err) {
		return sink.ClassUnavailable, ""
	}
	return sink.ClassMessages, ""
}

// isNetworkError: the path to the database failed (no SQLSTATE): such
// failures never count toward a message's attempts.
func isNetworkError(err error) bool {
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	switch {
	case errors.As(err, &netErr), errors.As(err, &connectErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, pgconn.ErrConnClosed),
		pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	}
	// Some teardown paths only say so in text (a connection killed while a
	// result was being read).
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "connection reset") ||
		strings.Contains(msg, "broken pipe")
}
