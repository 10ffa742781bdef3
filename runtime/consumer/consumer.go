// Package consumer is the runtime loop: fetch a batch, claim its ids and
// apply the effect in one transaction of the sink database (PostgreSQL or
// MySQL/MariaDB, through the runtime/sink seam), commit, and only then ack
// (DESIGN.md section 5).
package consumer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotency-dev/idc-operator/internal/pause"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/outbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// AfterCommitHook, when set, runs after a batch has committed and before it
// is acknowledged. It exists only for chaos tests (cmd wires it to
// IDC_FAILPOINT=after-commit-before-ack to exit abruptly there); production
// code must leave it nil.
var AfterCommitHook func()

// statsInterval is how often the inbox gauges (and partitions ahead) are
// refreshed.
const statsInterval = 15 * time.Second

// partitionsAhead is how many days of partitions are kept ready.
const partitionsAhead = 3

// ackTimeout bounds one acknowledgement; a slow broker must not hang the loop.
const ackTimeout = 30 * time.Second

// errStopped means the loop was asked to stop while a batch could not be
// committed; nothing of it was acknowledged, so the broker redelivers it.
var errStopped = errors.New("stopped before the batch could be committed")

// Consumer runs the loop for one IdempotentConsumer.
type Consumer struct {
	src   source.Source
	db    sink.DB
	store sink.Inbox
	// effect runs in the claim transaction; outside is the http effect
	// called before it (inline delivery), effect then only claims.
	effect  sink.Effect
	outside effect.Effect
	id      extract.Extractor
	// key is the entity key extractor (nil without message.entity): it
	// picks the lane.
	key      *extract.Extractor
	delivery config.Delivery
	source   config.Source
	metrics  *Metrics
	log      logr.Logger

	// onPayloadMismatch is message.onPayloadMismatch (see idConflicts).
	onPayloadMismatch string

	// emit writes the outbox rows of spec.emit (nil without it);
	// emitTracked says the effect reports which records changed state.
	emit        *outbox.Writer
	emitTracked bool

	dbReady    atomic.Bool
	fetchReady atomic.Bool
	held       atomic.Pointer[sinkHold] // nil unless holding on a misconfigured sink
	// holding counts settle calls (lanes) currently holding; the hold ends
	// when the last of them commits.
	holding atomic.Int32
	// holdLogged is the highest hold step logged, so lanes holding together
	// log each backoff step once.
	holdLogged atomic.Int64
	// crashed holds a lane's panic; abort stops the pipeline then.
	crashed atomic.Pointer[panicked]
	abort   crash

	// lost is the inbox loss the guard found (inboxguard.go); lostChecks
	// counts the checks that found it, the hold's step.
	lost       atomic.Pointer[error]
	lostChecks atomic.Int64

	// progress is what this replica records in <inbox>_progress.
	progress *progress

	// inFlightBatches counts the lane batches dispatched and not yet
	// settled; whole is closed once the fetch last dispatched whole to one
	// lane settled (dispatchWhole; the fetcher's alone).
	inFlightBatches atomic.Int32
	whole           chan struct{}
}

// New builds the loop from the config. metrics may be nil (then they are
// registered on a private registry).
func New(src source.Source, db sink.DB, cfg *config.Config, metrics *Metrics, logger logr.Logger) (*Consumer, error) {
	store, err := sink.InboxFor(db, cfg)
	if err != nil {
		return nil, err
	}
	var eff sink.Effect = claimOnly{}
	var outside effect.Effect
	switch h := cfg.Sink.Effect.HTTP; {
	case h == nil:
		if eff, err = db.Effect(cfg.Sink.Effect, cfg.Sink.Schema, cfg.Message.Entity); err != nil {
			return nil, err
		}
	case h.Delivery != config.HTTPOutbox:
		// The call is made before the transaction, which then only claims.
		if outside, err = effect.New(cfg.Sink.Effect, cfg.Sink.Schema, cfg.Message.Entity); err != nil {
			return nil, err
		}
	}
	id, err := extract.CompileExtractor(cfg.Message.ID)
	if err != nil {
		return nil, fmt.Errorf("while compiling message.id: %w", err)
	}
	var key *extract.Extractor
	if e := cfg.Message.Entity; e != nil {
		k, err := extract.CompileExtractor(e.Key)
		if err != nil {
			return nil, fmt.Errorf("while compiling message.entity.key: %w", err)
		}
		key = &k
	}
	if metrics == nil {
		if metrics, err = NewMetrics(prometheus.NewRegistry()); err != nil {
			return nil, err
		}
	}
	c := &Consumer{
		src: src, db: db, store: store, effect: eff, outside: outside, id: id, key: key,
		delivery: cfg.Delivery, source: cfg.Source, metrics: metrics, onPayloadMismatch: cfg.Message.OnPayloadMismatch,
		log: logger.WithValues("consumer", cfg.Name),
	}
	host, _ := os.Hostname()
	c.progress = newProgress(host, cfg.Source)
	if cfg.Emit != nil {
		if c.emit, err = outbox.NewWriter(cfg.Emit, key); err != nil {
			return nil, err
		}
		if c.emit.OnlyChanged() {
			c.emitTracked = sink.TrackChanges(eff)
		}
	}
	if h := cfg.Sink.Effect.HTTP; h != nil && h.Delivery == config.HTTPOutbox {
		// The call leaves the loop: the transaction claims the id (effect
		// is claimOnly) and writes the outbox row the dispatcher calls the
		// endpoint from.
		c.emit = outbox.NewHTTPWriter(h, key)
	}
	return c, nil
}

// SetReplica names this replica in its progress record (the pod name; a
// per-start suffix is added). Call it before Run.
func (c *Consumer) SetReplica(name string) { c.progress = newProgress(name, c.source) }

// Ready reports whether the database answered, the source delivered (or
// timed out empty) at least once, and the loop is not holding on a
// misconfigured sink (see Readiness).
func (c *Consumer) Ready() bool { return c.Readiness() == nil }

// Run consumes until ctx ends and returns nil then. Stopping is graceful:
// fetching stops at once, the batches whose transactions have started are
// still committed and acknowledged (unless they cannot commit, in which case
// they are left to the broker to redeliver); batches fetched but not started
// stay unacknowledged.
func (c *Consumer) Run(ctx context.Context) error {
	c.progress.useSource(unwrap(c.src))
	if !c.waitForDatabase(ctx) || !c.awaitInbox(ctx) || !c.registerProgress(ctx) {
		return nil
	}
	go c.watchInbox(ctx)
	go c.refreshStats(ctx)
	go c.reportProgress(ctx)
	if conf, ok := unwrap(c.src).(source.Confirmer); ok {
		go c.confirmAcks(ctx, conf)
	}
	c.pipeline(ctx)
	c.finishConfirming(ctx)
	return nil
}

func (c *Consumer) waitForDatabase(ctx context.Context) bool {
	for n := 1; ; n++ {
		err := c.db.Ping(ctx)
		if err == nil {
			c.dbReady.Store(true)
			c.ensurePartitionsAhead(ctx)
			return true
		}
		c.log.Error(err, "Database not reachable yet; backing off", "attempt", n)
		if !pause.For(ctx, backoff(n, c.delivery.BackoffInitial.Duration, c.delivery.BackoffMax.Duration)) {
			return false
		}
	}
}

func (c *Consumer) ensurePartitionsAhead(ctx context.Context) {
	if err := c.store.EnsurePartitions(ctx, time.Now().AddDate(0, 0, -1), partitionsAhead+1); err != nil {
		// Not fatal: the claim path creates a missing day on demand.
		c.log.Error(err, "Could not create inbox partitions ahead")
	}
}

func (c *Consumer) refreshStats(ctx context.Context) {
	t := time.NewTicker(statsInterval)
	defer t.Stop()
	for {
		st, err := c.store.Stats(ctx)
		if err == nil {
			c.metrics.InboxRows.Set(float64(st.Rows))
			c.metrics.OldestInboxRowAge.Set(st.OldestAge.Seconds())
		} else if ctx.Err() == nil {
			c.log.V(1).Info("Could not read inbox stats", "error", err.Error())
		}
		c.ensurePartitionsAhead(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
