// Package pause is how the runtime's loops wait: a sleep that ends early
// when the context does, and the exponential series of waits between
// retries. The consumer, the outbox relay, the redrive and the runtime's
// startup all retry through these.
package pause

import (
	"context"
	"time"
)

// For waits d, or until ctx ends; it reports whether the whole wait passed
// (false: ctx ended, stop).
func For(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Exponential is the wait after failure n (1-based): initial, doubled for
// each failure after the first, capped at maxWait. A maxWait of 0 or less
// caps nothing.
func Exponential(n int, initial, maxWait time.Duration) time.Duration {
	capped := maxWait > 0
	d := initial
	for i := 1; i < n && (!capped || d < maxWait); i++ {
		d *= 2
	}
	if capped {
		d = min(d, maxWait)
	}
	return d
}
