package consumer

import (
	"context"
	"fmt"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// idConflicts finds the duplicates of this claim whose payload differs from
// the one claimed first (a producer reusing an id) and applies
// message.id.onPayloadMismatch inside tx: Record keeps a row in
// <inbox>_id_conflicts, DeadLetter adds the message to dls, Ignore does
// nothing more. It returns how many there were (counted in
// idc_id_conflicts_total once the transaction commits) and the dead
// letters to write. The effect is never applied to a conflicting message:
// it is a duplicate for the inbox.
func (c *Consumer) idConflicts(ctx context.Context, tx sink.Tx, recs []*extract.Message, claims []inbox.Claim, fresh map[string]struct{}, dls []deadLetter) (int, []deadLetter, error) {
	if len(fresh) == len(claims) {
		return 0, dls, nil // no duplicate: the common case costs nothing
	}
	conflicts, err := c.store.Conflicts(ctx, tx, claims, fresh)
	if err != nil || len(conflicts) == 0 {
		return 0, dls, err
	}
	switch c.onPayloadMismatch {
	case config.PayloadMismatchDeadLetter:
		dls = append([]deadLetter(nil), dls...) // the caller may retry with its own slice
		for _, cf := range conflicts {
			m := recs[cf.Index]
			dls = append(dls, newDeadLetter(m, fmt.Sprintf("id conflict: payload fingerprint %016x differs from %016x, claimed first under this id",
				uint64(cf.Conflicted), uint64(cf.Claimed)), ReasonIDConflict, 1))
		}
	case config.PayloadMismatchIgnore:
	default:
		rows := make([]inbox.ConflictRecord, len(conflicts))
		for i, cf := range conflicts {
			m := recs[cf.Index]
			rows[i] = inbox.ConflictRecord{Conflict: cf, NativeID: m.NativeID, Payload: m.Body}
		}
		if err := c.store.RecordConflicts(ctx, tx, rows); err != nil {
			return 0, dls, err
		}
	}
	c.log.Info("Duplicate ids with a different payload: the producer reuses ids", "conflicts", len(conflicts),
		"first", conflicts[0].MessageID, "policy", c.onPayloadMismatch)
	return len(conflicts), dls, nil
}
