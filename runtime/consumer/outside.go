package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/idempotency-dev/idc-operator/internal/pause"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// claimOnly is the in-transaction step of the http effect: the call already
// happened (inline) or leaves through the outbox, so the transaction only
// claims, writes outbox rows and dead-letters.
type claimOnly struct{}

func (claimOnly) Apply(_ context.Context, _ sink.Tx, recs []*effect.Record) (effect.Result, error) {
	return effect.Result{Applied: len(recs)}, nil
}

// settleOutside settles a batch for an effect outside the database (http):
// skip ids already in the inbox, call, then claim the ids that succeeded and
// dead-letter permanent failures in one transaction. Retryable failures are
// called again after a backoff and count toward MaxAttempts, except outage
// failures (unreachable, timeout, 503, 429), which count only in rounds where
// other calls got through: an endpoint that is down delays the batch but
// never dead-letters it.
func (c *Consumer) settleOutside(work, stop context.Context, recs []*extract.Message, dls []deadLetter, out *outcome) error {
	attempts := map[*extract.Message]int{}
	for round := 1; ; round++ {
		todo, err := c.notYetDone(work, stop, recs, out)
		if err != nil {
			return err
		}
		res, err := c.outside.Apply(work, nil, todo)
		if err != nil {
			// Per-call problems come back in res; an error here is about
			// the effect as a whole, so treat it like an outage.
			c.log.Error(err, "Effect failed; retrying the batch", "round", round)
			if !pause.For(stop, c.backoff(round)) {
				return errStopped
			}
			continue
		}
		retry, failedDLs := c.classifyCalls(todo, res, attempts)
		okRecs := succeeded(todo, res)
		if len(okRecs)+len(dls)+len(failedDLs) > 0 {
			if err := c.settle(work, stop, okRecs, append(dls, failedDLs...), claimOnly{}, out); err != nil {
				return err
			}
		}
		if len(retry) == 0 {
			return nil
		}
		dls, recs = nil, retry
		c.log.Info("Retrying http calls", "records", len(retry), "round", round)
		if !pause.For(stop, c.backoff(round)) {
			return errStopped
		}
	}
}

// notYetDone drops records whose id is already in the inbox (a redelivery of
// a call that succeeded), retrying the lookup while the database is down.
func (c *Consumer) notYetDone(work, stop context.Context, recs []*extract.Message, out *outcome) ([]*extract.Message, error) {
	ids := make([]string, len(recs))
	for i, m := range recs {
		ids[i] = m.ID
	}
	for n := 1; ; n++ {
		done, err := c.store.Existing(work, ids)
		if err == nil {
			todo := make([]*extract.Message, 0, len(recs))
			for _, m := range recs {
				if _, ok := done[m.ID]; !ok {
					todo = append(todo, m)
				}
			}
			out.duplicates += len(recs) - len(todo)
			return todo, nil
		}
		c.log.Error(err, "Inbox lookup failed; retrying", "failures", n)
		if !pause.For(stop, c.backoff(n)) {
			return nil, errStopped
		}
	}
}

func (c *Consumer) classifyCalls(todo []*extract.Message, res effect.Result, attempts map[*extract.Message]int) ([]*extract.Message, []deadLetter) {
	// The endpoint served this round if any call did not end in an outage.
	answered := len(res.Failed) < len(todo)
	for _, f := range res.Failed {
		answered = answered || !f.Outage
	}
	var retry []*extract.Message
	var dls []deadLetter
	for _, f := range res.Failed {
		m := todo[f.Index]
		if f.Retryable && (!f.Outage || answered) {
			attempts[m]++
		}
		if f.Retryable && attempts[m] < c.delivery.MaxAttempts {
			retry = append(retry, m)
			continue
		}
		dls = append(dls, newDeadLetter(m, fmt.Sprintf("http: %v", f.Err), httpErrorClass(f.Err), max(attempts[m], 1)))
	}
	return retry, dls
}

func httpErrorClass(err error) string {
	if errors.Is(err, extract.ErrInvalidJSON) {
		return ReasonInvalidJSON
	}
	return ReasonHTTP
}

func succeeded(todo []*extract.Message, res effect.Result) []*extract.Message {
	failed := make(map[int]bool, len(res.Failed))
	for _, f := range res.Failed {
		failed[f.Index] = true
	}
	ok := make([]*extract.Message, 0, len(todo)-len(res.Failed))
	for i, m := range todo {
		if !failed[i] {
			ok = append(ok, m)
		}
	}
	return ok
}
