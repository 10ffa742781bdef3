package consumer

import (
	"errors"
	"fmt"
	"time"
)

// ErrSinkMisconfigured is wrapped by the error Readiness returns while the
// loop holds because the sink is misconfigured.
var ErrSinkMisconfigured = errors.New("sink misconfigured")

// sinkHold is the state of a hold: why, since when, and the last error.
type sinkHold struct {
	reason string
	since  time.Time
	cause  string
}

// hold records that the sink is misconfigured (readiness, gauge) and logs
// one line for this backoff step. The batch in flight stays unacknowledged
// and no new batch is fetched until a retry commits.
func (c *Consumer) hold(reason string, cause error, step int, wait time.Duration) {
	prev := c.held.Load()
	h := &sinkHold{reason: reason, since: time.Now(), cause: cause.Error()}
	if prev != nil {
		h.since = prev.since
	}
	c.held.Store(h)
	for _, r := range SinkReasons {
		v := 0.0
		if r == reason {
			v = 1
		}
		c.metrics.SinkMisconfigured.WithLabelValues(r).Set(v)
	}
	if !c.firstToLog(step) {
		return
	}
	c.log.Error(cause, "Sink misconfigured; holding: no fetch, no ack, no dead letter until it is fixed",
		"reason", reason, "step", step, "retryIn", wait.Round(time.Millisecond), "heldFor", time.Since(h.since).Round(time.Second))
}

// firstToLog reports whether step is the first of its number to be logged
// during this hold (every holding lane reaches each step).
func (c *Consumer) firstToLog(step int) bool {
	for {
		logged := c.holdLogged.Load()
		if int64(step) <= logged {
			return false
		}
		if c.holdLogged.CompareAndSwap(logged, int64(step)) {
			return true
		}
	}
}

// leaveHold: a lane that held has committed. The hold ends when no other
// lane still holds.
func (c *Consumer) leaveHold() {
	if c.holding.Add(-1) == 0 {
		c.releaseHold()
	}
}

// releaseHold ends a hold after a commit went through.
func (c *Consumer) releaseHold() {
	h := c.held.Swap(nil)
	c.holdLogged.Store(0)
	if h == nil {
		return
	}
	c.metrics.SinkMisconfigured.WithLabelValues(h.reason).Set(0)
	c.log.Info("Sink fixed; consuming again", "reason", h.reason, "heldFor", time.Since(h.since).Round(time.Second))
}

// Held reports whether the loop is holding because the sink is
// misconfigured, and why.
func (c *Consumer) Held() (reason string, held bool) {
	if h := c.held.Load(); h != nil {
		return h.reason, true
	}
	return "", false
}

// Readiness is nil when the consumer is ready (the /readyz check); otherwise
// the error says why not.
func (c *Consumer) Readiness() error {
	if h := c.held.Load(); h != nil {
		return fmt.Errorf("%w (%s) since %s: %s", ErrSinkMisconfigured, h.reason, h.since.UTC().Format(time.RFC3339), h.cause)
	}
	switch {
	case !c.dbReady.Load():
		return errors.New("database not reached yet")
	case !c.fetchReady.Load():
		return errors.New("source not fetched from yet")
	}
	return nil
}
