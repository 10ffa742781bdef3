package consumer

import (
	"context"

	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// emitBatch is the outbox rows of one transaction's new records, row i
// belonging to the i-th record passed to the effect.
type emitBatch struct {
	rows []inbox.OutboxRow
	// released are claimed ids whose emit payload could not be built: they
	// leave the inbox and become dead letters, before any effect.
	released []string
}

// prepareEmit builds the outbox rows of the new records before the effect
// runs, so a record whose payload lacks a declared emit field is
// dead-lettered without an effect (never an effect without its event). It
// returns the records to apply.
func (c *Consumer) prepareEmit(recs []*extract.Message, dls []deadLetter) ([]*extract.Message, emitBatch, []deadLetter) {
	var b emitBatch
	if c.emit == nil {
		return recs, b, dls
	}
	kept := make([]*extract.Message, 0, len(recs))
	b.rows = make([]inbox.OutboxRow, 0, len(recs))
	for _, m := range recs {
		row, err := c.emit.Row(m)
		if err != nil {
			b.released = append(b.released, m.ID)
			dls = append(dls, newDeadLetter(m, err.Error(), evalErrorClass(err), 1))
			continue
		}
		kept = append(kept, m)
		b.rows = append(b.rows, row)
	}
	return kept, b, dls
}

// writeEmit writes, in the claim transaction, the rows of the records the
// effect applied: every applied record, or with emit.when: Changed on an
// upsert only those the sequence gate let through (res.Changed).
func (c *Consumer) writeEmit(ctx context.Context, tx sink.Tx, b emitBatch, res effect.Result) error {
	if c.emit == nil || len(b.rows) == 0 {
		return nil
	}
	var rows []inbox.OutboxRow
	if c.emitTracked {
		rows = make([]inbox.OutboxRow, 0, len(res.Changed))
		for _, i := range res.Changed {
			rows = append(rows, b.rows[i])
		}
	} else {
		failed := make(map[int]bool, len(res.Failed))
		for _, f := range res.Failed {
			failed[f.Index] = true
		}
		rows = make([]inbox.OutboxRow, 0, len(b.rows))
		for i, r := range b.rows {
			if !failed[i] {
				rows = append(rows, r)
			}
		}
	}
	return c.store.WriteOutbox(ctx, tx, rows)
}
