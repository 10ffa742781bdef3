package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotency-dev/idc-operator/internal/pause"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
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
	// Store is the inbox whose outbox is relayed, DB its sink database.
	Store     sink.Inbox
	DB        sink.DB
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
	// BeforePublish, when set, runs after a batch was claimed and before it
	// is published: the point right after the consumer's COMMIT when the
	// event exists only in the outbox. Chaos tests only
	// (IDC_FAILPOINT=relay-before-publish), like AfterPublish.
	BeforePublish func() error
	// MaxAttempts is how many counted failures an event may have before it
	// goes to the dead letters; 0 means never (broker targets: only
	// ErrRejected dead-letters there).
	MaxAttempts int
	// DeadLetterClass is the reason_class of a dead-lettered event
	// (default inbox.OutboxRejectedClass).
	DeadLetterClass string
	// DeadLettered, when set, is called with the class of every event the
	// relay moved to the dead letters after its transaction committed (cmd
	// counts them in idc_dead_letters_total, which the alert watches).
	DeadLettered func(class string)

	backoffs shardBackoffs
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
// larger than the broker takes, the endpoint answered 4xx): a Publisher
// wraps it around the error of that event, which goes to the dead letters.
var ErrRejected = errors.New("rejected by the emit target")

// ErrRetryable marks a failure the target itself reported for this event
// (an http 5xx or 408): it is retried and counts toward MaxAttempts. Any
// other error is an outage (unreachable, timed out, shedding load), retried
// without counting unless the target answered other events of the batch.
var ErrRetryable = errors.New("failed at the emit target")

// EachPublisher is a Publisher whose events succeed or fail one by one,
// not as a confirmed prefix (the http dispatcher, which calls different
// keys in parallel): PublishEach returns one result per event, nil when it
// was delivered. Events of one OrderKey are delivered in order: after a
// failure, the later events of that key are not attempted.
type EachPublisher interface {
	Publisher
	PublishEach(ctx context.Context, events []inbox.PendingEvent) []error
}

// work goes round the shards from start, publishing a batch of each shard
// it can lock, until ctx ends. A shard whose batch failed is left alone for
// its own backoff (shared by this relay's workers), so one failing key or
// event delays its shard, not the others.
func (r *Relay) work(ctx context.Context, start int) error {
	for ctx.Err() == nil {
		full := false
		for i := range inbox.OutboxShards {
			shard := (start + i) % inbox.OutboxShards
			if !r.backoffs.due(shard) {
				continue
			}
			n, err := r.RelayShard(ctx, shard)
			if errors.Is(err, errFailpoint) {
				return err
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				failures, wait := r.backoffs.failed(shard, r.BackoffInitial, r.BackoffMax)
				r.Log.Error(err, "Outbox relay failed; backing off this shard", "shard", shard, "failures", failures, "retryIn", wait.String())
				continue
			}
			r.backoffs.succeeded(shard)
			full = full || n >= r.BatchSize
		}
		if !full && !pause.For(ctx, r.Poll) {
			return nil
		}
	}
	return nil
}

// shardBackoffs is the failure count and next try of every shard.
type shardBackoffs struct {
	mu        sync.Mutex
	failures  [inbox.OutboxShards]int
	notBefore [inbox.OutboxShards]time.Time
}

func (b *shardBackoffs) due(shard int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !time.Now().Before(b.notBefore[shard])
}

func (b *shardBackoffs) failed(shard int, initial, limit time.Duration) (int, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures[shard]++
	d := pause.Exponential(b.failures[shard], max(initial, time.Millisecond), limit)
	b.notBefore[shard] = time.Now().Add(d)
	return b.failures[shard], d
}

func (b *shardBackoffs) succeeded(shard int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures[shard], b.notBefore[shard] = 0, time.Time{}
}

// RelayShard publishes one batch of shard's unsent rows and marks what the
// target confirmed sent, in the one transaction that holds the rows. A crash
// between publish and commit leaves them unsent: they are published again
// with the same id (at least once, deduplicated by the id). Events that
// failed keep their place (the next pass retries them, in id order), with
// the error recorded; an event the target refused for good, or one whose
// counted attempts reached MaxAttempts, goes to the dead letters so its
// shard keeps going. It returns how many rows it marked sent (0 when another
// relay owns the shard).
func (r *Relay) RelayShard(ctx context.Context, shard int) (int, error) {
	tx, err := r.DB.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("while beginning the relay transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after a commit
	events, ok, err := r.Store.ClaimOutboxShard(ctx, tx, shard, max(r.BatchSize, 1))
	if err != nil || !ok || len(events) == 0 {
		return 0, err
	}
	if r.BeforePublish != nil {
		if err := r.BeforePublish(); err != nil {
			return 0, fmt.Errorf("%w: %w", errFailpoint, err)
		}
	}
	// A claimed batch is published and marked even when a stop is
	// requested meanwhile: marking it is what saves a republish.
	ctx = context.WithoutCancel(ctx)
	pubCtx, cancel := context.WithTimeout(ctx, publishTimeout)
	started := time.Now()
	results := r.publish(pubCtx, events)
	cancel()
	r.Metrics.PublishDuration.Observe(time.Since(started).Seconds())
	var sent []int64
	for i, e := range events {
		if results[i] == nil {
			sent = append(sent, e.ID)
		}
	}
	if r.AfterPublish != nil && len(sent) > 0 {
		if err := r.AfterPublish(); err != nil {
			return 0, fmt.Errorf("%w: %w", errFailpoint, err)
		}
	}
	if err := r.Store.MarkOutboxSent(ctx, tx, sent); err != nil {
		return 0, err
	}
	var dead []string // the classes of the events dead-lettered in tx
	firstErr, err := r.settleFailures(ctx, tx, events, results, &dead)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("while committing the relay transaction: %w", err)
	}
	r.Metrics.Published.Add(float64(len(sent)))
	for _, class := range dead {
		r.Metrics.Rejected.Inc()
		if r.DeadLettered != nil {
			r.DeadLettered(class)
		}
	}
	if firstErr != nil {
		r.Metrics.Failures.Inc()
		return len(sent), fmt.Errorf("while publishing %d outbox events of shard %d (%d confirmed): %w", len(events), shard, len(sent), firstErr)
	}
	return len(sent), nil
}

// errNotAttempted marks an event a publisher did not try because an earlier
// one (of the batch, or of its key) failed: it keeps its place, uncounted.
var errNotAttempted = errors.New("not attempted after an earlier failure")

// publish returns one result per event, nil for a confirmed one.
func (r *Relay) publish(ctx context.Context, events []inbox.PendingEvent) []error {
	if ep, ok := r.Publisher.(EachPublisher); ok {
		return ep.PublishEach(ctx, events)
	}
	n, err := r.Publisher.Publish(ctx, events)
	results := make([]error, len(events))
	if n < len(events) {
		if err == nil {
			err = errors.New("the target confirmed only part of the batch")
		}
		results[n] = err
		for i := n + 1; i < len(events); i++ {
			results[i] = errNotAttempted
		}
	}
	return results
}

// settleFailures records the failed events of a batch in tx and moves to the
// dead letters those the target refused for good (ErrRejected) and those
// whose counted attempts reached MaxAttempts. A failure counts when it is
// ErrRetryable, or an outage while another event of the batch got through
// (the target answered): a target that is down delays events but never
// dead-letters them, as with the inline http effect. It returns the first
// failure that is left to retry.
func (r *Relay) settleFailures(ctx context.Context, tx sink.Tx, events []inbox.PendingEvent, results []error, dead *[]string) (retry, err error) {
	f := classifyFailures(results)
	for _, i := range f.rejected {
		if err := r.deadLetter(ctx, tx, events[i], results[i], dead); err != nil {
			return nil, err
		}
	}
	if err := r.noteFailures(ctx, tx, events, results, f.counted, true, dead); err != nil {
		return nil, err
	}
	if err := r.noteFailures(ctx, tx, events, results, f.uncounted, false, dead); err != nil {
		return nil, err
	}
	return f.first, nil
}

// failures are the indexes of a batch's failed events by what happens to
// them.
type failures struct {
	rejected, counted, uncounted []int
	first                        error // the first failure left to retry
}

func classifyFailures(results []error) failures {
	answered := false
	for _, res := range results {
		answered = answered || res == nil || errors.Is(res, ErrRetryable) || errors.Is(res, ErrRejected)
	}
	var f failures
	for i, res := range results {
		switch {
		case res == nil || errors.Is(res, errNotAttempted):
			continue
		case errors.Is(res, ErrRejected):
			f.rejected = append(f.rejected, i)
			continue
		case errors.Is(res, ErrRetryable) || answered:
			f.counted = append(f.counted, i)
		default:
			f.uncounted = append(f.uncounted, i)
		}
		if f.first == nil {
			f.first = res
		}
	}
	return f
}

// noteFailures records the failure of the events at idx (one statement; the
// reason recorded is the first's, which is what an operator reading
// last_error needs) and, for counted failures, dead-letters the events that
// reached MaxAttempts.
func (r *Relay) noteFailures(ctx context.Context, tx sink.Tx, events []inbox.PendingEvent, results []error, idx []int, counted bool, dead *[]string) error {
	if len(idx) == 0 {
		return nil
	}
	ids := make([]int64, len(idx))
	for k, i := range idx {
		ids[k] = events[i].ID
	}
	attempts, err := r.Store.NoteOutboxFailure(ctx, tx, ids, results[idx[0]].Error(), counted)
	if err != nil || !counted || r.MaxAttempts <= 0 {
		return err
	}
	for _, i := range idx {
		if n := attempts[events[i].ID]; n >= r.MaxAttempts {
			e := events[i]
			e.Attempts = n
			if err := r.deadLetter(ctx, tx, e, fmt.Errorf("gave up after %d attempts: %w", n, results[i]), dead); err != nil {
				return err
			}
		}
	}
	return nil
}

// deadLetter moves e to the dead letters in tx and appends its class to
// dead (counted once tx commits).
func (r *Relay) deadLetter(ctx context.Context, tx sink.Tx, e inbox.PendingEvent, reason error, dead *[]string) error {
	class := r.DeadLetterClass
	if class == "" {
		class = inbox.OutboxRejectedClass
	}
	if err := r.Store.DeadLetterOutbox(ctx, tx, e, reason.Error(), class); err != nil {
		return err
	}
	r.Log.Error(reason, "Outbox event dead-lettered", "eventId", e.EventID, "messageId", e.SourceID, "class", class)
	*dead = append(*dead, class)
	return nil
}

func (r *Relay) refreshStats(ctx context.Context) {
	for {
		if st, err := r.Store.OutboxStats(ctx); err == nil {
			r.Metrics.Pending.Set(float64(st.Pending))
			r.Metrics.OldestAge.Set(st.OldestAge.Seconds())
		} else if ctx.Err() == nil {
			r.Log.V(1).Info("Could not read outbox stats", "error", err.Error())
		}
		if !pause.For(ctx, statsInterval) {
			return
		}
	}
}

// Metrics are the relay's Prometheus metrics.
type Metrics struct {
	Pending         prometheus.Gauge
	OldestAge       prometheus.Gauge
	Published       prometheus.Counter
	Rejected        prometheus.Counter
	Failures        prometheus.Counter
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
			Help: "Outbox events moved to the dead letters: refused for good by the target (too large, http 4xx) or out of attempts."}),
		Failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "idc_outbox_publish_failures_total",
			Help: "Relay batches in which an event failed to publish and was left to retry (see the runtime log and last_error)."}),
		PublishDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "idc_outbox_publish_duration_seconds",
			Help: "Time to publish one relay batch until the broker confirmed it.", Buckets: prometheus.DefBuckets}),
	}
	for _, c := range []prometheus.Collector{m.Pending, m.OldestAge, m.Published, m.Rejected, m.Failures, m.PublishDuration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("while registering outbox metrics: %w", err)
		}
	}
	return m, nil
}
