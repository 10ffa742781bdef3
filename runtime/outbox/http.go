package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// HTTPDeadLetterClass is the reason_class of a call the dispatcher gave up
// on: the same class as the inline http effect's, so alerts and redrive
// filters do not depend on the delivery mode.
const HTTPDeadLetterClass = "http"

// dispatchConcurrency bounds the calls one relay batch has in flight; calls
// of one order key are made one after the other.
const dispatchConcurrency = 32

// HTTPDispatcher is the publisher of the http effect with delivery: Outbox.
// It calls the endpoint once per outbox row with Idempotency-Key: <source
// message id> (the same key as inline delivery, so switching modes keeps
// the endpoint's dedupe) and the incoming payload, keys in parallel and one
// key's rows in order.
type HTTPDispatcher struct {
	caller *effect.HTTPCaller
}

// NewHTTPDispatcher builds the dispatcher of cfg's endpoint.
func NewHTTPDispatcher(cfg *config.HTTP) (*HTTPDispatcher, error) {
	c, err := effect.NewHTTPCaller(cfg)
	if err != nil {
		return nil, err
	}
	return &HTTPDispatcher{caller: c}, nil
}

// PublishEach calls the endpoint for every event: a 4xx (but 408, 429) is
// ErrRejected, a 5xx (but 503) or 408 ErrRetryable, anything else an
// outage. After a failure the later events of its key are not attempted.
func (d *HTTPDispatcher) PublishEach(ctx context.Context, events []inbox.PendingEvent) []error {
	results := make([]error, len(events))
	var order []string
	byKey := map[string][]int{}
	for i, e := range events {
		if _, ok := byKey[e.OrderKey]; !ok {
			order = append(order, e.OrderKey)
		}
		byKey[e.OrderKey] = append(byKey[e.OrderKey], i)
	}
	sem := make(chan struct{}, dispatchConcurrency)
	var wg sync.WaitGroup
	for _, k := range order {
		idx := byKey[k]
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			failed := false
			for _, i := range idx {
				if failed {
					results[i] = errNotAttempted
					continue
				}
				if err := d.call(ctx, events[i]); err != nil {
					results[i], failed = err, true
				}
			}
		})
	}
	wg.Wait()
	return results
}

func (d *HTTPDispatcher) call(ctx context.Context, e inbox.PendingEvent) error {
	err := d.caller.Call(ctx, e.SourceID, e.Payload, e.Headers)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, effect.ErrHTTPPermanent):
		return fmt.Errorf("%w: message %s: %w", ErrRejected, e.SourceID, err)
	case errors.Is(err, effect.ErrHTTPRetryable):
		return fmt.Errorf("%w: message %s: %w", ErrRetryable, e.SourceID, err)
	}
	return fmt.Errorf("message %s: %w", e.SourceID, err)
}

// Publish is PublishEach reported as a confirmed prefix.
func (d *HTTPDispatcher) Publish(ctx context.Context, events []inbox.PendingEvent) (int, error) {
	for i, err := range d.PublishEach(ctx, events) {
		if err != nil {
			return i, err
		}
	}
	return len(events), nil
}

// Close releases the idle connections.
func (d *HTTPDispatcher) Close() { d.caller.Close() }
