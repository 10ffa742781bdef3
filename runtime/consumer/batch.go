package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/idempotency-dev/idc-operator/internal/pause"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// maxIDBytes keeps ids well under the btree entry limit (~2.7kB): a longer id
// would fail every claim of its batch.
const maxIDBytes = 1024

// deadLetter is a dead-letter row plus its metrics label.
type deadLetter struct {
	row   inbox.DeadLetter
	class string
}

// outcome is what the committed transactions of a batch did; it is only
// counted once they committed, so retries never double-count.
type outcome struct {
	applied, stale, duplicates, conflicts int
	dead                                  map[string]int
}

func (o *outcome) add(p outcome) {
	o.conflicts += p.conflicts
	o.applied += p.applied
	o.stale += p.stale
	o.duplicates += p.duplicates
	if o.dead == nil {
		o.dead = map[string]int{}
	}
	for k, v := range p.dead {
		o.dead[k] += v
	}
}

// process settles one lane's batch and acknowledges it. It returns
// errStopped when stop ended while the batch could not be committed
// (nothing acked).
//
// The batch counts as unacknowledged in this replica's progress record from
// before its transaction begins until its ack: a stop that may have left
// part of it committed (bisection, an unknown COMMIT outcome) keeps it
// counted, so the replica's last record holds pruning back from it.
func (c *Consumer) process(work, stop context.Context, lb laneBatch) error {
	out := outcome{duplicates: lb.dups}
	token := c.progress.begin()
	var err error
	if c.outside == nil {
		err = c.settle(work, stop, lb.recs, lb.dls, c.effect, &out)
	} else {
		err = c.settleOutside(work, stop, lb.recs, lb.dls, &out)
	}
	if err != nil {
		return err
	}
	c.progress.committed(lb.msgs)
	if AfterCommitHook != nil {
		AfterCommitHook()
	}
	if c.dead() {
		// Another lane crashed after this commit began: as in a killed
		// process, nothing is acknowledged any more.
		return errStopped
	}
	ackCtx, cancel := context.WithTimeout(work, ackTimeout)
	defer cancel()
	ackErr := c.src.Ack(ackCtx, lb.msgs)
	c.progress.acked(token, lb.msgs, ackErr)
	acked := len(lb.msgs)
	if ackErr != nil {
		// Committed effects are safe: the broker redelivers, the inbox dedupes.
		// The messages are not counted as settled: idc_messages_total counts
		// what the broker took back, and these come again.
		acked = 0
		c.metrics.AckErrors.Inc()
		c.log.Error(ackErr, "Ack failed after commit; the broker will redeliver, and the claims hold pruning back until the broker confirms them settled", "messages", len(lb.msgs))
	}
	c.record(acked, out, time.Since(lb.fetched))
	return nil
}

// record counts a committed batch: acked is how many of its messages the
// broker acknowledged (0 when the ack failed), the outcome is the database's.
func (c *Consumer) record(acked int, out outcome, took time.Duration) {
	c.metrics.Messages.Add(float64(acked))
	c.metrics.DuplicatesSkipped.Add(float64(out.duplicates))
	c.metrics.StaleRefused.Add(float64(out.stale))
	c.metrics.IDConflicts.Add(float64(out.conflicts))
	for class, v := range out.dead {
		c.metrics.DeadLetters.WithLabelValues(class).Add(float64(v))
	}
	c.metrics.BatchDuration.Observe(took.Seconds())
}

var errBadID = errors.New("invalid message id")

func checkID(id string) error {
	switch {
	case len(id) > maxIDBytes:
		return fmt.Errorf("%w: longer than %d bytes", errBadID, maxIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not valid UTF-8", errBadID)
	}
	for i := 0; i < len(id); i++ {
		if id[i] == 0 {
			return fmt.Errorf("%w: contains a NUL byte", errBadID)
		}
	}
	return nil
}

func idErrorClass(err error) string {
	switch {
	case errors.Is(err, extract.ErrInvalidJSON):
		return ReasonInvalidJSON
	case errors.Is(err, errBadID):
		return ReasonInvalidID
	}
	return ReasonMissingID
}

func evalErrorClass(err error) string {
	if errors.Is(err, extract.ErrInvalidJSON) {
		return ReasonInvalidJSON
	}
	return ReasonEvaluation
}

func newDeadLetter(m *extract.Message, reason, class string, attempts int) deadLetter {
	return deadLetter{class: class, row: inbox.DeadLetter{
		MessageID: m.ID, NativeID: m.NativeID, Reason: reason, Class: class, Payload: m.Body,
		Headers: m.Headers, Attempts: max(attempts, m.Attempt), PublishedAt: m.PublishedAt,
	}}
}

// settle commits recs (claim + effect) and dls. A failing transaction is
// retried with backoff; connection-class failures are retried until the
// database returns and never count as attempts; sink failures (the sink is
// misconfigured) hold the loop until the sink is fixed and never count
// either. A group that keeps failing is bisected (at once for a data error);
// a single record that still fails after MaxAttempts becomes a dead letter
// carrying the database error, and the rest proceeds.
func (c *Consumer) settle(work, stop context.Context, recs []*extract.Message, dls []deadLetter, eff sink.Effect, out *outcome) (settleErr error) {
	limit := c.attemptLimit(len(recs))
	attempts, outages, holds := 0, 0, 0
	defer func() {
		switch {
		case holds == 0:
		case settleErr == nil:
			c.leaveHold()
		default:
			c.holding.Add(-1) // stopping: the hold is not over, the process is
		}
	}()
	for {
		part, err := c.commit(work, recs, dls, eff)
		if err == nil {
			out.add(part)
			return nil
		}
		var wait time.Duration
		switch kind, reason := c.classify(err); kind {
		case failureUnavailable:
			outages++
			wait = c.backoff(outages)
			c.log.Error(err, "Database unavailable; retrying the batch", "records", len(recs), "failures", outages)
		case failureSink:
			if holds == 0 {
				c.holding.Add(1)
			}
			holds++
			wait = c.backoff(holds)
			c.hold(reason, err, holds, wait)
		default:
			attempts++
			if attempts >= limit || (kind == failureData && len(recs) > 1) {
				return c.isolate(work, stop, recs, dls, eff, out, err, attempts)
			}
			wait = c.backoff(attempts)
			c.log.Error(err, "Batch failed; retrying", "records", len(recs), "attempt", attempts)
		}
		if !pause.For(stop, wait) {
			return errStopped
		}
	}
}

// attemptLimit: a group is retried once (a transient error such as a
// deadlock passes) before it is split; a single record gets MaxAttempts;
// dead letters alone are retried until they commit (they must never be lost).
func (c *Consumer) attemptLimit(records int) int {
	switch records {
	case 0:
		return int(^uint(0) >> 1)
	case 1:
		return c.delivery.MaxAttempts
	}
	return min(2, c.delivery.MaxAttempts)
}

func (c *Consumer) isolate(work, stop context.Context, recs []*extract.Message, dls []deadLetter, eff sink.Effect, out *outcome, cause error, attempts int) error {
	if len(recs) == 1 {
		c.log.Error(cause, "Dead-lettering a message that keeps failing", "messageId", recs[0].ID, "attempts", attempts)
		dl := newDeadLetter(recs[0], "database: "+cause.Error(), ReasonDatabase, attempts)
		return c.settle(work, stop, nil, append(dls, dl), eff, out)
	}
	mid := len(recs) / 2
	if err := c.settle(work, stop, recs[:mid], dls, eff, out); err != nil {
		return err
	}
	return c.settle(work, stop, recs[mid:], nil, eff, out)
}

func (c *Consumer) backoff(n int) time.Duration {
	return backoff(n, c.delivery.BackoffInitial.Duration, c.delivery.BackoffMax.Duration)
}

// commit runs one transaction: claim, effect for the new ids, dead letters.
func (c *Consumer) commit(ctx context.Context, recs []*extract.Message, dls []deadLetter, eff sink.Effect) (outcome, error) {
	if err := c.inboxLost(); err != nil {
		return outcome{}, err
	}
	if err := c.ensurePartitionsFor(ctx, recs); err != nil {
		return outcome{}, err
	}
	var out outcome
	err := c.inTx(ctx, func(tx sink.Tx) error {
		var err error
		if out, dls, err = c.claimAndApply(ctx, tx, recs, dls, eff); err != nil {
			return err
		}
		rows := make([]inbox.DeadLetter, len(dls))
		for i, d := range dls {
			rows[i] = d.row
		}
		inserted, err := c.store.DeadLetter(ctx, tx, rows)
		// Only new rows count: a poison message redelivered by the broker
		// is one dead letter, however often it comes back.
		for i, d := range dls {
			if err == nil && inserted[i] {
				out.dead[d.class]++
			}
		}
		return err
	})
	if err != nil {
		// A partition pruned since it was cached shows up as a failed
		// insert; forget the cache so the retry re-creates it.
		c.store.ForgetPartitions()
		return outcome{}, fmt.Errorf("while committing a batch of %d records: %w", len(recs), err)
	}
	return out, nil
}

func (c *Consumer) ensurePartitionsFor(ctx context.Context, recs []*extract.Message) error {
	if c.store.Layout() != config.LayoutPartitioned || len(recs) == 0 {
		return nil
	}
	times := make([]time.Time, len(recs))
	for i, m := range recs {
		times[i] = m.PublishedAt
	}
	return c.store.EnsurePartitionsFor(ctx, times)
}

// claimAndApply claims recs and applies the effect to the new ones. Records
// the effect cannot evaluate are released from the inbox and dead-lettered.
func (c *Consumer) claimAndApply(ctx context.Context, tx sink.Tx, recs []*extract.Message, dls []deadLetter, eff sink.Effect) (outcome, []deadLetter, error) {
	out := outcome{dead: map[string]int{}}
	claims := make([]inbox.Claim, len(recs))
	for i, m := range recs {
		claims[i] = inbox.Claim{MessageID: m.ID, PublishedAt: m.PublishedAt, Fingerprint: inbox.Fingerprint(m.Body)}
	}
	fresh, err := c.store.Claim(ctx, tx, claims)
	if err != nil {
		return out, nil, err
	}
	if out.conflicts, dls, err = c.idConflicts(ctx, tx, recs, claims, fresh, dls); err != nil {
		return out, nil, err
	}
	newRecs := make([]*extract.Message, 0, len(fresh))
	for _, m := range recs {
		if _, ok := fresh[m.ID]; ok {
			newRecs = append(newRecs, m)
		}
	}
	out.duplicates = len(recs) - len(newRecs)
	dls = append([]deadLetter(nil), dls...) // the caller may retry with its own slice
	var emit emitBatch
	newRecs, emit, dls = c.prepareEmit(newRecs, dls)
	res, err := eff.Apply(ctx, tx, newRecs)
	if err != nil {
		return out, nil, err
	}
	if err := c.writeEmit(ctx, tx, emit, res); err != nil {
		return out, nil, err
	}
	out.applied, out.stale = res.Applied, res.Stale
	released := emit.released
	for _, f := range res.Failed {
		m := newRecs[f.Index]
		released = append(released, m.ID)
		dls = append(dls, newDeadLetter(m, f.Err.Error(), evalErrorClass(f.Err), 1))
	}
	return out, dls, c.store.Unclaim(ctx, tx, released)
}

// inTx runs fn in a READ COMMITTED transaction of the sink database (the
// partitioned claim relies on a fresh snapshot per statement; on MySQL it
// avoids gap locks between claims) and times the COMMIT.
func (c *Consumer) inTx(ctx context.Context, fn func(sink.Tx) error) error {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after a commit
	if err := fn(tx); err != nil {
		return err
	}
	start := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("while committing: %w", err)
	}
	c.metrics.CommitDuration.Observe(time.Since(start).Seconds())
	return nil
}
