package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/consumer"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// minWedgeAfter is the shortest silence after which the loop counts as
// wedged. A healthy loop touches the broker at least every maxWait; a batch
// that cannot commit retries with at most backoffMax between attempts. A
// loop silent for this long is better restarted: nothing uncommitted was
// acknowledged, so the broker redelivers it and the inbox dedupes.
const minWedgeAfter = 10 * time.Minute

// loopState answers the probes: /readyz from the consumer, /healthz from the
// time of the loop's last call into the source.
type loopState struct {
	consumer   atomic.Pointer[consumer.Consumer]
	lastActive atomic.Int64 // unix nanoseconds; zero until the loop runs
	wedgeAfter time.Duration
	now        func() time.Time
}

func newLoopState(backoffMax time.Duration) *loopState {
	return &loopState{wedgeAfter: max(minWedgeAfter, 5*backoffMax), now: time.Now}
}

func (s *loopState) ready() error {
	c := s.consumer.Load()
	if c == nil {
		return errors.New("starting")
	}
	return c.Readiness()
}

// live is nil while starting (the startup retries log their own progress),
// while the loop keeps reaching the source, and while it holds on a
// misconfigured sink (a deliberate wait that a restart cannot fix; it logs
// each retry and ends by itself once the sink is fixed).
func (s *loopState) live() error {
	last := s.lastActive.Load()
	if last == 0 {
		return nil
	}
	if c := s.consumer.Load(); c != nil {
		if _, held := c.Held(); held {
			return nil
		}
	}
	if idle := s.now().Sub(time.Unix(0, last)); idle > s.wedgeAfter {
		return fmt.Errorf("the consumer loop has not fetched or acknowledged for %s (limit %s)",
			idle.Round(time.Second), s.wedgeAfter)
	}
	return nil
}

func (s *loopState) touch() { s.lastActive.Store(s.now().UnixNano()) }

// watchedSource records every call the loop makes into the source. Source
// is set once the broker is reachable, before the loop runs.
type watchedSource struct {
	source.Source
	state *loopState
}

func (w *watchedSource) Fetch(ctx context.Context, maxN int, maxWait time.Duration) ([]source.Message, error) {
	w.state.touch()
	defer w.state.touch()
	return w.Source.Fetch(ctx, maxN, maxWait)
}

// Unwrap is the adapter, for the optional interfaces the consumer asks it
// for (source.Confirmer, source.CreationTimer).
func (w *watchedSource) Unwrap() source.Source { return w.Source }

func (w *watchedSource) Ack(ctx context.Context, msgs []source.Message) error {
	defer w.state.touch()
	return w.Source.Ack(ctx, msgs)
}
