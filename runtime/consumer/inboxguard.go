package consumer

import (
	"context"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/pause"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// The inbox guard: the runtime claims only into the inbox of the epoch its
// config names (the one the controller provisioned), checked before the
// first fetch and every retention.ProgressInterval after, idle or not. A
// lost inbox (dropped, truncated, re-created) holds the loop like a
// misconfigured sink, reason inbox_lost: nothing is fetched, claimed,
// acknowledged or dead-lettered, /readyz fails and
// idc_sink_misconfigured{reason="inbox_lost"} is 1, until a person accepts
// the loss (the controller then records a new epoch and the pods roll) or
// the inbox comes back.

// inboxCheckInterval is how often a running replica verifies its inbox.
const inboxCheckInterval = retention.ProgressInterval

// checkInbox verifies the inbox once: a loss holds the loop, an intact
// inbox ends a hold it caused. A check that could not run changes nothing
// (the claim path says what is wrong with the database).
func (c *Consumer) checkInbox(ctx context.Context) bool {
	err := c.store.Verify(ctx)
	switch {
	case inbox.IsLost(err):
		c.lost.Store(&err)
		c.hold(SinkInboxLost, err, int(c.lostChecks.Add(1)), inboxCheckInterval)
		return false
	case err == nil && c.lost.Swap(nil) != nil:
		c.lostChecks.Store(0)
		if h, held := c.Held(); held && h == SinkInboxLost {
			c.releaseHold()
		}
	}
	return true
}

// awaitInbox holds before the first fetch until the inbox is intact, or
// ctx ends (false).
func (c *Consumer) awaitInbox(ctx context.Context) bool {
	for !c.checkInbox(ctx) {
		if !pause.For(ctx, inboxCheckInterval) {
			return false
		}
	}
	return ctx.Err() == nil
}

// watchInbox re-checks the inbox every inboxCheckInterval until ctx ends.
func (c *Consumer) watchInbox(ctx context.Context) {
	every(ctx, inboxCheckInterval, func() { c.checkInbox(ctx) })
}

// every runs fn each period until ctx ends (the first run one period in).
func every(ctx context.Context, period time.Duration, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

// inboxLost is the loss the guard found, nil while the inbox is intact: a
// transaction about to claim fails with it instead.
func (c *Consumer) inboxLost() error {
	if p := c.lost.Load(); p != nil {
		return *p
	}
	return nil
}
