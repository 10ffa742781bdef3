package consumer

import (
	"context"

	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// Outcome is what settling one redriven message did.
type Outcome string

// Outcomes of SettleOne; they are also the outcome column of <inbox>_redrives.
const (
	// OutcomeApplied: the effect was written.
	OutcomeApplied Outcome = "applied"
	// OutcomeDuplicate: the id was already in the inbox; nothing applied.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeStale: claimed, but the sequence gate refused the update.
	OutcomeStale Outcome = "stale"
	// OutcomeStillFailing: the effect failed again (Reason, Class say why).
	OutcomeStillFailing Outcome = "still_failing"
	// OutcomeUnusable: no usable message id could be extracted.
	OutcomeUnusable Outcome = "unusable"
)

// Settlement is what SettleOne did inside the caller's transaction.
type Settlement struct {
	Outcome   Outcome
	MessageID string
	// Reason and Class are set for OutcomeStillFailing and OutcomeUnusable.
	Reason, Class string
}

// SettleOne puts one stored message through the loop's own path inside tx:
// extract the id, claim it, apply the effect to it if it was new (sequence
// gate included). It is what redrive uses, so a redriven dead letter is
// treated exactly like a live delivery. An effect that cannot evaluate the
// message leaves it unclaimed (OutcomeStillFailing). An error is a failed
// statement: tx is aborted; FaultOfMessage says whether the message is to
// blame.
func (c *Consumer) SettleOne(ctx context.Context, tx sink.Tx, sm source.Message) (Settlement, error) {
	m := extract.NewMessage(sm)
	id, err := c.id.Text(m)
	if err == nil {
		err = checkID(id)
	}
	if err != nil {
		return Settlement{Outcome: OutcomeUnusable, Reason: "message id: " + err.Error(), Class: idErrorClass(err)}, nil
	}
	m.ID = id
	recs := []*extract.Message{m}
	if err := c.ensurePartitionsFor(ctx, recs); err != nil {
		return Settlement{}, err
	}
	out, dls, err := c.claimAndApply(ctx, tx, recs, nil, c.effect)
	if err != nil {
		return Settlement{}, err
	}
	s := Settlement{MessageID: id}
	switch {
	case len(dls) > 0:
		s.Outcome, s.Reason, s.Class = OutcomeStillFailing, dls[0].row.Reason, dls[0].class
	case out.duplicates > 0:
		s.Outcome = OutcomeDuplicate
	case out.stale > 0:
		s.Outcome = OutcomeStale
	default:
		s.Outcome = OutcomeApplied
	}
	return s, nil
}

// Fault says whose fault a failed SettleOne is, and so what redrive does.
type Fault int

const (
	// FaultMessage: something about the message, or an unknown cause:
	// retried up to maxAttempts, then the dead letter fails again.
	FaultMessage Fault = iota
	// FaultData: a value of the message does not fit (SQLSTATE 22, 23):
	// the dead letter fails again at once.
	FaultData
	// FaultUnavailable: the database is down or the transaction lost to
	// another one (deadlock, serialization): retried, never counted.
	FaultUnavailable
	// FaultSink: the sink is misconfigured: redrive stops, nothing counted.
	FaultSink
)

// FaultOf classifies err, from a transaction of this consumer's sink
// database, like the loop does; reason is the sink reason for FaultSink.
func (c *Consumer) FaultOf(err error) (Fault, string) {
	switch kind, reason := c.classify(err); kind {
	case failureData:
		return FaultData, ""
	case failureUnavailable:
		return FaultUnavailable, ""
	case failureSink:
		return FaultSink, reason
	}
	return FaultMessage, ""
}

// ReasonForDatabaseError is the dead-letter reason and class the loop writes
// for a message whose transaction keeps failing with err.
func ReasonForDatabaseError(err error) (reason, class string) {
	return "database: " + err.Error(), ReasonDatabase
}
