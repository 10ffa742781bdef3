package consumer

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempotency-dev/idc-operator/internal/pause"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// failureKind is what a failed transaction says, and so what the loop does.
type failureKind int

const (
	// failureMessages: something about these messages (or an unknown
	// cause): retried, counted as attempts, bisected, and the one message
	// that keeps failing is dead-lettered.
	failureMessages failureKind = iota
	// failureData: a value of one message does not fit (SQLSTATE classes
	// 22 data exception and 23 integrity constraint): handled like
	// failureMessages, so the message that causes it is dead-lettered.
	failureData
	// failureUnavailable: the database or the path to it is down: retried
	// until it returns, never counted as an attempt.
	failureUnavailable
	// failureSink: the sink itself is wrong (missing table, column, unique
	// key, privilege; an invalid statement; a read-only database). No
	// message is to blame: the loop holds (no fetch, no ack, no dead
	// letter, no attempt counted) and retries until the sink is fixed.
	failureSink
)

// Sink-misconfigured reasons: the bounded label values of
// idc_sink_misconfigured and the reason /readyz gives.
const (
	SinkUndefinedTable        = "undefined_table"
	SinkUndefinedColumn       = "undefined_column"
	SinkUndefinedObject       = "undefined_object"
	SinkNoUniqueConstraint    = "no_unique_constraint"
	SinkInsufficientPrivilege = "insufficient_privilege"
	SinkInvalidStatement      = "invalid_statement"
	SinkReadOnly              = "read_only"
	SinkAuthentication        = "authentication"
	SinkUndefinedDatabase     = "undefined_database"
	// SinkInboxLost: the inbox no longer holds the epoch this runtime
	// started with (dropped, truncated, re-created): claiming into it would
	// apply again what it had deduplicated (inbox.LostError).
	SinkInboxLost = "inbox_lost"
)

// SinkReasons lists every reason, so the gauge can export each one (0 when
// not the current one).
var SinkReasons = []string{
	SinkUndefinedTable, SinkUndefinedColumn, SinkUndefinedObject, SinkNoUniqueConstraint,
	SinkInsufficientPrivilege, SinkInvalidStatement, SinkReadOnly, SinkAuthentication, SinkUndefinedDatabase,
	SinkInboxLost,
}

// sqlStateRule maps a SQLSTATE (5 characters) or class (its first 2) to a
// failure kind. The first rule whose code is a prefix of the SQLSTATE wins,
// so exact codes come before their class.
type sqlStateRule struct {
	code   string
	kind   failureKind
	reason string // failureSink only
}

// sqlStateRules is the one list of how database errors are treated
// (https://www.postgresql.org/docs/current/errcodes-appendix.html). A
// SQLSTATE matching no rule is failureMessages.
var sqlStateRules = []sqlStateRule{
	// The sink is wrong: class 42 (syntax error or access rule violation)
	// is raised when a statement is parsed, planned or checked, before any
	// value of a message is read, so no message can cause it.
	{code: "42P01", kind: failureSink, reason: SinkUndefinedTable},
	{code: "3F000", kind: failureSink, reason: SinkUndefinedTable}, // invalid schema name
	{code: "42703", kind: failureSink, reason: SinkUndefinedColumn},
	{code: "42P10", kind: failureSink, reason: SinkNoUniqueConstraint}, // no unique constraint matching ON CONFLICT
	{code: "42501", kind: failureSink, reason: SinkInsufficientPrivilege},
	{code: "42601", kind: failureSink, reason: SinkInvalidStatement}, // syntax; also "cannot insert multiple commands into a prepared statement"
	{code: "42704", kind: failureSink, reason: SinkUndefinedObject},
	{code: "42883", kind: failureSink, reason: SinkUndefinedObject}, // undefined function or operator
	{code: "42", kind: failureSink, reason: SinkInvalidStatement},
	{code: "25006", kind: failureSink, reason: SinkReadOnly}, // read-only SQL transaction (a standby, default_transaction_read_only)
	{code: "0A000", kind: failureSink, reason: SinkInvalidStatement},
	{code: "28", kind: failureSink, reason: SinkAuthentication}, // invalid authorization (wrong password, role gone)
	{code: "3D000", kind: failureSink, reason: SinkUndefinedDatabase},
	// The database is unavailable: connection exceptions (08), operator
	// intervention (57P01 admin shutdown / pg_terminate_backend, 57P02 crash
	// shutdown, 57P03 cannot connect now), insufficient resources (53: disk
	// full, out of memory, too many connections) and rollbacks caused by
	// other transactions (40001 serialization failure, 40P01 deadlock).
	{code: "08", kind: failureUnavailable},
	{code: "53", kind: failureUnavailable},
	{code: "57P01", kind: failureUnavailable},
	{code: "57P02", kind: failureUnavailable},
	{code: "57P03", kind: failureUnavailable},
	{code: "40001", kind: failureUnavailable},
	{code: "40P01", kind: failureUnavailable},
	// A value does not fit: the message that carries it is dead-lettered.
	{code: "22", kind: failureData},
	{code: "23", kind: failureData},
}

// classifySQLState returns the kind of a SQLSTATE and, for failureSink, the
// reason.
func classifySQLState(code string) (failureKind, string) {
	for _, r := range sqlStateRules {
		if strings.HasPrefix(code, r.code) {
			return r.kind, r.reason
		}
	}
	return failureMessages, ""
}

// classify says what a failed transaction means (see failureKind); reason
// is set for failureSink.
func classify(err error) (failureKind, string) {
	if inbox.IsLost(err) {
		return failureSink, SinkInboxLost
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return classifySQLState(pgErr.Code)
	}
	if isNetworkError(err) {
		return failureUnavailable, ""
	}
	return failureMessages, ""
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

// backoff returns the wait before retry number n (1-based): exponential from
// initial, capped at max, with jitter over the upper half so replicas that
// failed together do not retry together.
func backoff(n int, initial, maxWait time.Duration) time.Duration {
	d := pause.Exponential(n, initial, maxWait)
	half := d / 2
	return half + rand.N(half+1)
}
