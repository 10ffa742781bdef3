// Package redrive replays dead letters exactly once: each selected row goes
// through the consumer's own extract → claim → effect path in ONE
// transaction that also deletes the row (or records its new failure) and
// logs the outcome in <inbox>_redrives. The dead letters live in the same
// database as the effect, which is what makes this exactly once where a
// broker's redrive is at least once.
//
// It is safe to run twice and next to the live replicas: the row is locked
// FOR UPDATE SKIP LOCKED (two redrives never settle one row twice), and the
// inbox claim settles an id already there as a duplicate. The sequence gate
// still applies (a stale update is refused and counted). A message that
// fails again stays, with one attempt more and the new reason; a row
// without a usable id is reported and left in place. A misconfigured sink
// or an unreachable database stops the run without touching the row.
package redrive

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/idempotency-dev/idc-operator/internal/pause"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/consumer"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// outcomeSkipped is a selected row that was gone or locked by a concurrent
// redrive when its turn came; it is not recorded.
const outcomeSkipped = "skipped"

// outcomeRequeued is a dead-lettered outbox event put back in the outbox:
// its message's claim and effect committed long ago, only the publish (or
// the http call) is to be done again.
const outcomeRequeued = "requeued"

// ErrNotTheMessage wraps the error that stopped a run because the sink or
// the database, not a message, is at fault.
var ErrNotTheMessage = errors.New("redrive stopped: the sink or the database is at fault, not the message")

// Options select what to redrive.
type Options struct {
	// Run names this run in <inbox>_redrives (the annotation's token for a
	// Job the controller runs).
	Run    string
	Filter inbox.DeadLetterFilter
	// DryRun settles every selected row and rolls each transaction back:
	// the result says what a real run would do, nothing changes.
	DryRun bool
}

// Result counts what the run did with the rows it selected.
type Result struct {
	Run          string `json:"run"`
	DryRun       bool   `json:"dryRun,omitempty"`
	Selected     int    `json:"selected"`
	Applied      int    `json:"applied"`
	Duplicates   int    `json:"duplicates"`
	Stale        int    `json:"stale"`
	StillFailing int    `json:"stillFailing"`
	Unusable     int    `json:"unusable"`
	Requeued     int    `json:"requeued"`
	// Skipped rows were gone or held by a concurrent redrive.
	Skipped int `json:"skipped"`
}

func (r *Result) count(outcome string) {
	switch consumer.Outcome(outcome) {
	case consumer.OutcomeApplied:
		r.Applied++
	case consumer.OutcomeDuplicate:
		r.Duplicates++
	case consumer.OutcomeStale:
		r.Stale++
	case consumer.OutcomeStillFailing:
		r.StillFailing++
	case consumer.OutcomeUnusable:
		r.Unusable++
	case outcomeRequeued:
		r.Requeued++
	default:
		r.Skipped++
	}
}

// Redriver redrives the dead letters of one inbox.
type Redriver struct {
	db       sink.DB
	store    sink.Inbox
	settler  *consumer.Consumer
	delivery config.Delivery
	log      logr.Logger
	// transactional is false for the http effect: its calls cannot be
	// rolled back, so a dry run only selects.
	transactional bool
}

// New builds a redriver from the same config the consumer runs with.
func New(db sink.DB, cfg *config.Config, log logr.Logger) (*Redriver, error) {
	store, err := sink.InboxFor(db, cfg, inbox.WithRedrives())
	if err != nil {
		return nil, err
	}
	settler, err := consumer.New(nil, db, cfg, nil, log)
	if err != nil {
		return nil, err
	}
	return &Redriver{db: db, store: store, settler: settler, delivery: cfg.Delivery, log: log,
		transactional: cfg.Sink.Effect.HTTP == nil || cfg.UsesOutbox()}, nil
}

// Store is the inbox the redriver works on.
func (r *Redriver) Store() sink.Inbox { return r.store }

// Run redrives every row opts select, one transaction each, oldest first.
func (r *Redriver) Run(ctx context.Context, opts Options) (Result, error) {
	res := Result{Run: opts.Run, DryRun: opts.DryRun}
	if opts.Run == "" {
		return res, errors.New("while redriving: a run name is required")
	}
	// The first redrive of an inbox creates its log of outcomes (and an
	// inbox of an older runtime is upgraded); idempotent.
	if err := r.store.Migrate(ctx); err != nil {
		return res, err
	}
	ids, err := r.store.SelectDeadLetters(ctx, opts.Filter)
	if err != nil {
		return res, err
	}
	res.Selected = len(ids)
	if opts.DryRun && !r.transactional {
		r.log.Info("Dry run with an http effect: calls cannot be rolled back, so rows are only selected", "selected", len(ids))
		return res, nil
	}
	for _, id := range ids {
		outcome, err := r.one(ctx, opts, id)
		if err != nil {
			return res, err
		}
		res.count(outcome)
	}
	return res, nil
}

// maxOutageRetries bounds the retries of one row while the database is
// unavailable or the transaction keeps losing to others (a deadlock with a
// live replica); they never count as attempts.
const maxOutageRetries = 10

// one settles dead letter id. A transient failure is retried (an outage up
// to maxOutageRetries times, then the run stops; a failure of the message
// up to delivery.maxAttempts, then the row is recorded as failing again); a
// data error is recorded at once; a misconfigured sink stops the run.
func (r *Redriver) one(ctx context.Context, opts Options, id int64) (string, error) {
	attempts, outages := 0, 0
	for {
		outcome, err := r.settle(ctx, opts, id)
		if err == nil {
			return outcome, nil
		}
		if ctx.Err() != nil {
			return "", fmt.Errorf("while redriving dead letter %d: %w", id, ctx.Err())
		}
		var wait time.Duration
		switch fault, reason := r.settler.FaultOf(err); fault {
		case consumer.FaultSink:
			return "", fmt.Errorf("%w (sink %s; dead letter %d left as it was): %w", ErrNotTheMessage, reason, id, err)
		case consumer.FaultUnavailable:
			if outages++; outages > maxOutageRetries {
				return "", fmt.Errorf("%w (database unavailable; dead letter %d left as it was): %w", ErrNotTheMessage, id, err)
			}
			wait = r.backoff(outages)
		case consumer.FaultData:
			return r.failAgain(ctx, opts, id, err)
		default:
			if attempts++; attempts >= r.delivery.MaxAttempts {
				return r.failAgain(ctx, opts, id, err)
			}
			wait = r.backoff(attempts)
		}
		r.log.Error(err, "Redrive of a dead letter failed; retrying", "deadLetter", id, "retryIn", wait.String())
		if !pause.For(ctx, wait) {
			return "", fmt.Errorf("while redriving dead letter %d: %w", id, ctx.Err())
		}
	}
}

// backoff doubles from delivery.backoffInitial up to delivery.backoffMax.
func (r *Redriver) backoff(n int) time.Duration {
	return pause.Exponential(n, r.delivery.BackoffInitial.Duration, r.delivery.BackoffMax.Duration)
}

// settle runs the one transaction of a redrive: lock the row, settle the
// message through the consumer's path, then delete the row (applied,
// duplicate, stale) or record its new failure, and log the outcome.
func (r *Redriver) settle(ctx context.Context, opts Options, id int64) (string, error) {
	var outcome string
	err := r.inTx(ctx, opts.DryRun, func(tx sink.Tx) error {
		d, err := r.store.LockDeadLetter(ctx, tx, id)
		if err != nil || d == nil {
			outcome = outcomeSkipped
			return err
		}
		if strings.HasPrefix(d.NativeID, inbox.OutboxNativeIDPrefix) {
			// An outbox event: the source message's id is in the inbox
			// (its effect committed), so the claim would settle it as a
			// duplicate and the event would be lost. It goes back in the
			// outbox, with its attempts reset, for the relay.
			if err := r.store.RequeueOutbox(ctx, tx, *d); err != nil {
				return err
			}
			if err := r.store.DeleteDeadLetter(ctx, tx, id); err != nil {
				return err
			}
			outcome = outcomeRequeued
			return r.store.RecordRedrive(ctx, tx, inbox.Redrive{Run: opts.Run, DeadLetterID: id,
				MessageID: d.MessageID, Outcome: outcome})
		}
		published := d.PublishedAt
		if published.IsZero() {
			published = d.DeadAt
		}
		s, err := r.settler.SettleOne(ctx, tx, source.Message{
			NativeID: d.NativeID, Headers: d.Headers, Body: d.Payload, PublishedAt: published, Attempt: d.Attempts,
		})
		if err != nil {
			return err
		}
		switch s.Outcome {
		case consumer.OutcomeUnusable:
			r.log.Info("Dead letter has no usable message id; left in place", "deadLetter", id, "reason", s.Reason)
		case consumer.OutcomeStillFailing:
			err = r.store.FailDeadLetterAgain(ctx, tx, id, s.Reason, s.Class)
		default:
			err = r.store.DeleteDeadLetter(ctx, tx, id)
		}
		if err != nil {
			return err
		}
		outcome = string(s.Outcome)
		return r.store.RecordRedrive(ctx, tx, inbox.Redrive{Run: opts.Run, DeadLetterID: id,
			MessageID: s.MessageID, Outcome: outcome, Reason: s.Reason})
	})
	return outcome, err
}

// failAgain records that dead letter id failed once more with err.
func (r *Redriver) failAgain(ctx context.Context, opts Options, id int64, cause error) (string, error) {
	reason, class := consumer.ReasonForDatabaseError(cause)
	r.log.Error(cause, "Redriven message failed again; it stays dead-lettered", "deadLetter", id)
	outcome := outcomeSkipped
	err := r.inTx(ctx, opts.DryRun, func(tx sink.Tx) error {
		d, err := r.store.LockDeadLetter(ctx, tx, id)
		if err != nil || d == nil {
			return err
		}
		if err := r.store.FailDeadLetterAgain(ctx, tx, id, reason, class); err != nil {
			return err
		}
		outcome = string(consumer.OutcomeStillFailing)
		return r.store.RecordRedrive(ctx, tx, inbox.Redrive{Run: opts.Run, DeadLetterID: id,
			MessageID: d.MessageID, Outcome: outcome, Reason: reason})
	})
	if err != nil {
		return "", fmt.Errorf("while recording that dead letter %d failed again: %w", id, err)
	}
	return outcome, nil
}

// inTx runs fn in a READ COMMITTED transaction (what the partitioned claim
// needs) and commits it, or rolls it back for a dry run.
func (r *Redriver) inTx(ctx context.Context, dryRun bool, fn func(sink.Tx) error) error {
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after a commit
	if err := fn(tx); err != nil {
		return err
	}
	if dryRun {
		return nil
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("while committing: %w", err)
	}
	return nil
}
