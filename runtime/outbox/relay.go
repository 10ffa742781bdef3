package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// Publisher sends events to the emit target with their EventID as the
// broker's dedup key.
type Publisher interface {
	// Publish sends events in order and reports how many of them, from the
	// first, the broker confirmed; err says why the rest were not.
	Publish(ctx context.Context, events []inbox.PendingEvent) (int, error)
	Close()
}

// Relay publishes unsent outbox rows. Every replica runs one; they share the
// work shard by shard (a shard is published by one relay at a time, in id
// order, which keeps the order of one entity key).
type Relay struct {
	Store     *inbox.Store
	Pool      *pgxpool.Pool
	Publisher Publisher
	Metrics   *Metrics
	Log       logr.Logger
	// BatchSize is the most rows one relay transaction publishes.
	BatchSize int
	// Workers is how many shards this relay publishes at once.
	Workers int
	// Poll is the pause after a pass that found no full batch.
	Poll time.Duration
	// BackoffInitial and BackoffMax bound the pause after a failure.
	BackoffInitial, BackoffMax time.Duration
	// AfterPublish, when set, runs after the broker confirmed a batch and
	// before it is marked sent. It exists only for chaos tests (cmd wires
	// IDC_FAILPOINT=relay-after-publish-before-mark to a SIGKILL there); an
	// error abandons the batch unmarked (its transaction rolls back, as a
	// killed process's would) and ends Run with that error.
	AfterPublish func() error
}

// publishTimeout bounds one batch's publish while its rows stay locked.
const publishTimeout = 30 * time.Second

// statsInterval is how often the backlog gauges are refreshed.
const statsInterval = 5 * time.Second

// Run relays until ctx ends (nil) or AfterPublish fails (its error).
func (r *Relay) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	wg.Go(func() { r.refreshStats(ctx) })
	for w := range max(r.Workers, 1) {
		wg.Go(func() {
			if err := r.work(ctx, w*inbox.OutboxShards/max(r.Workers, 1)); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

var errFailpoint = errors.New("relay failpoint")

// ErrRejected marks a publish error that retrying cannot fix (the event is
// larger than the broker takes): a Publisher wraps it around the error of
// the first unconfirmed event.
var ErrRejected = errors.New("rejected by the emit target")

// work goes round the shards from start, publishing a batch of each shard
// it can lock, until ctx ends.
func (r *Relay) work(ctx context.Context, start int) error {
	failures := 0
	for k := 0; ctx.Err() == nil; k++ {
		full := false
		for i := range inbox.OutboxShards {
			n, err := r.RelayShard(ctx, (start+i)%inbox.OutboxShards)
			if errors.Is(err, errFailpoint) {
				return err
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				failures++
				r.Log.Error(err, "Outbox relay failed; backing off", "failures", failures)
				if !sleep(ctx, backoff(failures, r.BackoffInitial, r.BackoffMax)) {
					return nil
				}
				continue
			}
			failures = 0
			full = full || n >= r.BatchSize
		}
		if !full && !sleep(ctx, r.Poll) {
			return nil
		}
	}
	return nil
}

// RelayShard publishes one batch of shard's unsent rows and marks what the
// broker confirmed sent, in the one transaction that holds the rows. A crash
// between publish and commit leaves them unsent: they are published again
// with the same id (at least once, deduplicated by the id). It returns how
// many rows it marked sent (0 when another relay owns the shard).
func (r *Relay) RelayShard(ctx context.Context, shard int) (int, error) {
	tx, err := r.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("while beginning the relay transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after a commit
	events, ok, err := r.Store.ClaimOutboxShard(ctx, tx, shard, max(r.BatchSize, 1))
	if err != nil || !ok || len(events) == 0 {
		return 0, err
	}
	// A claimed batch is published and marked even when a stop is
	// requested meanwhile: marking it is what saves a republish.
	ctx = context.WithoutCancel(ctx)
	pubCtx, cancel := context.WithTimeout(ctx, publishTimeout)
	started := time.Now()
	n, pubErr := r.Publisher.Publish(pubCtx, events)
	cancel()
	r.Metrics.PublishDuration.Observe(time.Since(started).Seconds())
	if r.AfterPublish != nil && n > 0 {
		if err := r.AfterPublish(); err != nil {
			return 0, fmt.Errorf("%w: %w", errFailpoint, err)
		}
	}
	ids := make([]int64, n)
	for i := range n {
		ids[i] = events[i].ID
	}
	if err := r.Store.MarkOutboxSent(ctx, tx, ids); err != nil {
		return 0, err
	}
	if errors.Is(pubErr, ErrRejected) && n < len(events) {
		// The event after the confirmed prefix can never be published:
		// set it aside with its reason instead of blocking its shard.
		if err := r.Store.DeadLetterOutbox(ctx, tx, events[n], pubErr.Error()); err != nil {
			return 0, err
		}
		r.Log.Error(pubErr, "Outbox event rejected by the target; dead-lettered", "eventId", events[n].EventID, "messageId", events[n].SourceID)
		r.Metrics.Rejected.Inc()
		pubErr = nil
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("while committing the relay transaction: %w", err)
	}
	r.Metrics.Published.Add(float64(n))
	if pubErr != nil {
		return n, fmt.Errorf("while publishing %d outbox events of shard %d (%d confirmed): %w", len(events), shard, n, pubErr)
	}
	return n, nil
}

func (r *Relay) refreshStats(ctx context.Context) {
	for {
		if st, err := r.Store.OutboxStats(ctx); err == nil {
			r.Metrics.Pending.Set(float64(st.Pending))
			r.Metrics.OldestAge.Set(st.OldestAge.Seconds())
		} else if ctx.Err() == nil {
			r.Log.V(1).Info("Could not read outbox stats", "error", err.Error())
		}
		if !sleep(ctx, statsInterval) {
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// backoff doubles from initial up to limit.
func backoff(n int, initial, limit time.Duration) time.Duration {
	d := max(initial, time.Millisecond)
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	if limit > 0 {
		d = min(d, limit)
	}
	return d
}

// Metrics are the relay's Prometheus metrics.
type Metrics struct {
	Pending         prometheus.Gauge
	OldestAge       prometheus.Gauge
	Published       prometheus.Counter
	Rejected        prometheus.Counter
	PublishDuration prometheus.Histogram
}

// NewMetrics registers the relay's metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "idc_outbox_pending",
			Help: "Outbox rows not yet published (refreshed every few seconds)."}),
		OldestAge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "idc_outbox_oldest_age_seconds",
			Help: "Age of the oldest unpublished outbox row, 0 when none."}),
		Published: prometheus.NewCounter(prometheus.CounterOpts{Name: "idc_outbox_published_total",
			Help: "Outbox events the broker confirmed and the relay marked sent."}),
		Rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "idc_outbox_rejected_total",
			Help: "Outbox events the target refused for good (too large), moved to the dead letters."}),
		PublishDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "idc_outbox_publish_duration_seconds",
			Help: "Time to publish one relay batch until the broker confirmed it.", Buckets: prometheus.DefBuckets}),
	}
	for _, c := range []prometheus.Collector{m.Pending, m.OldestAge, m.Published, m.Rejected, m.PublishDuration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("while registering outbox metrics: %w", err)
		}
	}
	return m, nil
}
