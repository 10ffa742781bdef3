package benchprune

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// claimer claims batches of new ids back to back, each in its own READ
// COMMITTED transaction after ensuring partitions, like the runtime, and
// records when each one started and ended. It stops between batches, never
// by cancelling one, so every committed claim is counted.
type claimer struct {
	store  *inbox.Store
	pool   *pgxpool.Pool
	prefix string

	mu      sync.Mutex
	samples []sample
	claimed int64
}

type sample struct{ start, end time.Time }

func (c *claimer) run(ctx context.Context, stop *atomic.Bool) error {
	for n := 0; !stop.Load(); n++ {
		claims := make([]inbox.Claim, claimBatch)
		now := time.Now()
		for i := range claims {
			claims[i] = inbox.Claim{MessageID: fmt.Sprintf("%s%d-%d", c.prefix, n, i), PublishedAt: now}
		}
		start := time.Now()
		got, err := c.claim(ctx, claims)
		end := time.Now()
		if err != nil {
			return fmt.Errorf("batch %d: %w", n, err)
		}
		if len(got) != claimBatch {
			return fmt.Errorf("batch %d: %d of %d new ids claimed as new", n, len(got), claimBatch)
		}
		c.mu.Lock()
		c.samples = append(c.samples, sample{start, end})
		c.claimed += int64(len(got))
		c.mu.Unlock()
	}
	return nil
}

func (c *claimer) claim(ctx context.Context, claims []inbox.Claim) (map[string]struct{}, error) {
	if err := c.store.EnsurePartitionsFor(ctx, []time.Time{claims[0].PublishedAt}); err != nil {
		return nil, err
	}
	tx, err := c.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	got, err := c.store.Claim(ctx, tx, claims)
	if err != nil {
		return nil, err
	}
	return got, tx.Commit(ctx)
}

func (c *claimer) completedAfter(t time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.samples {
		if s.end.After(t) {
			n++
		}
	}
	return n
}

// split returns the latencies of the claims that ended before the prune
// started (less the warm-up) and of those that overlapped the prune.
func (c *claimer) split(pruneStart, pruneEnd time.Time) (idle, during []time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.samples {
		switch {
		case !s.end.After(pruneStart):
			if i >= warmup {
				idle = append(idle, s.end.Sub(s.start))
			}
		case s.start.Before(pruneEnd):
			during = append(during, s.end.Sub(s.start))
		}
	}
	return idle, during
}

// waitFor polls cond until it holds or done is closed.
func waitFor(done <-chan struct{}, cond func() bool) {
	for !cond() {
		select {
		case <-done:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}
