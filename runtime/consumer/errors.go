package consumer

import (
	"math/rand/v2"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/pause"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// failureKind is what a failed transaction says, and so what the loop does
// (the sink seam's classes, runtime/sink):
//
//   - failureMessages: something about these messages (or an unknown
//     cause): retried, counted as attempts, bisected, and the one message
//     that keeps failing is dead-lettered.
//   - failureData: a value of one message does not fit (SQLSTATE classes
//     22 data exception and 23 integrity constraint): handled like
//     failureMessages, so the message that causes it is dead-lettered.
//   - failureUnavailable: the database or the path to it is down, or
//     another transaction rolled this one back (deadlock, serialization):
//     retried until it passes, never counted as an attempt.
//   - failureSink: the sink itself is wrong (missing table, column, unique
//     key, privilege; an invalid statement; a read-only database). No
//     message is to blame: the loop holds (no fetch, no ack, no dead
//     letter, no attempt counted) and retries until the sink is fixed.
type failureKind = sink.Class

const (
	failureMessages    = sink.ClassMessages
	failureData        = sink.ClassData
	failureUnavailable = sink.ClassUnavailable
	failureSink        = sink.ClassSink
)

// Sink-misconfigured reasons: the bounded label values of
// idc_sink_misconfigured and the reason /readyz gives.
const (
	SinkUndefinedTable        = sink.ReasonUndefinedTable
	SinkUndefinedColumn       = sink.ReasonUndefinedColumn
	SinkUndefinedObject       = sink.ReasonUndefinedObject
	SinkNoUniqueConstraint    = sink.ReasonNoUniqueConstraint
	SinkInsufficientPrivilege = sink.ReasonInsufficientPrivilege
	SinkInvalidStatement      = sink.ReasonInvalidStatement
	SinkReadOnly              = sink.ReasonReadOnly
	SinkAuthentication        = sink.ReasonAuthentication
	SinkUndefinedDatabase     = sink.ReasonUndefinedDatabase
	// SinkInboxLost: the inbox no longer holds the epoch this runtime
	// started with (dropped, truncated, re-created): claiming into it would
	// apply again what it had deduplicated (inbox.LostError).
	SinkInboxLost = sink.ReasonInboxLost
)

// SinkReasons lists every reason, so the gauge can export each one (0 when
// not the current one).
var SinkReasons = []string{
	SinkUndefinedTable, SinkUndefinedColumn, SinkUndefinedObject, SinkNoUniqueConstraint,
	SinkInsufficientPrivilege, SinkInvalidStatement, SinkReadOnly, SinkAuthentication, SinkUndefinedDatabase,
	SinkInboxLost,
}

// classify says what a failed transaction means (see failureKind); reason
// is set for failureSink. The table is the sink database's dialect's
// (SQLSTATE on PostgreSQL, error numbers on MySQL: sink.DB.Classify).
func (c *Consumer) classify(err error) (failureKind, string) {
	return classifyWith(c.db, err)
}

func classifyWith(db sink.DB, err error) (failureKind, string) {
	if inbox.IsLost(err) {
		return failureSink, SinkInboxLost
	}
	return db.Classify(err)
}

// backoff returns the wait before retry number n (1-based): exponential from
// initial, capped at max, with jitter over the upper half so replicas that
// failed together do not retry together.
func backoff(n int, initial, maxWait time.Duration) time.Duration {
	d := pause.Exponential(n, initial, maxWait)
	half := d / 2
	return half + rand.N(half+1)
}
