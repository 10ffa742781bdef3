package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/errtext"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// brokerTimeout bounds one broker read of a pass.
const brokerTimeout = 15 * time.Second

// BrokerReading is what one read of the broker returned.
type BrokerReading struct {
	// Result is the derived window with its inputs and the consumer's
	// broker-side limits (see retention.Derive).
	Result retention.Result
	// Lag is the broker's backlog for the consumer; nil when it could not
	// be read (the window may still have been).
	Lag *int64
}

// BrokerObserver reads the broker of one resource: the window's inputs, the
// consumer's limits and its lag, over one connection. Errors are
// retention.Derive's (ErrBrokerUnreachable, ErrSourceNotFound,
// ErrUnboundedReplay with the Result still filled in, ErrInvalidSpec).
type BrokerObserver interface {
	Observe(ctx context.Context, cfg *config.Config, getenv func(string) string, now time.Time) (BrokerReading, error)
}

// LiveBroker is the BrokerObserver on runtime/retention, the code the prune
// job and the runtime's lag gauge run.
type LiveBroker struct{}

// Observe implements BrokerObserver.
func (LiveBroker) Observe(ctx context.Context, cfg *config.Config, getenv func(string) string, now time.Time) (BrokerReading, error) {
	rd, err := retention.Read(ctx, cfg, getenv, now)
	out := BrokerReading{Result: rd.Result}
	if rd.LagErr == nil {
		lag := rd.Lag
		out.Lag = &lag
	}
	return out, err
}

// brokerReads counts the manager's broker reads by source kind and outcome.
var brokerReads = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "idc_controller_broker_reads_total",
	Help: "Broker reads by the manager (window inputs, limits and lag over one connection), by source kind and result (ok, error).",
}, []string{"source", "result"})

// statusPatches counts the status writes of the manager.
var statusPatches = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "idc_controller_status_patches_total",
	Help: "Status patches the manager sent; a pass whose status did not change sends none.",
})

// childApplies counts the server-side applies of rendered children.
var childApplies = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "idc_controller_child_applies_total",
	Help: "Server-side applies of rendered children (ConfigMap, Deployment, CronJob) by kind; a child whose rendering and live generation are unchanged is not applied.",
}, []string{"kind"})

// phaseSeconds is how long each phase of a pass takes.
var phaseSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "idc_controller_phase_duration_seconds",
	Help:    "Duration of each reconcile phase (render, conflict, secrets, finalizer, inbox, effect, broker, retention, children, last-prune, outbox, id-conflicts, redrive).",
	Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
}, []string{"phase"})

func init() {
	ctrlmetrics.Registry.MustRegister(brokerReads, statusPatches, childApplies, phaseSeconds)
}

// brokerReading is a read kept between passes: the broker is read at most
// once per --retention-period (and at once when the source, the retention
// spec or a referenced Secret changes), a failed read again after
// --recheck-period.
type brokerReading struct {
	key     string
	at      time.Time
	reading BrokerReading
	err     error
}

// failedRead says whether the broker could not be read; an unbounded
// replay is an answer, not a failure.
func (b *brokerReading) failedRead() bool {
	return b.err != nil && !errors.Is(b.err, retention.ErrUnboundedReplay)
}

func (b *brokerReading) ttl(period, recheck time.Duration) time.Duration {
	if b.failedRead() {
		return min(period, recheck)
	}
	return period
}

// dueIn is how long until the reading is stale.
func (b *brokerReading) dueIn(now time.Time, period, recheck time.Duration) time.Duration {
	return b.at.Add(b.ttl(period, recheck)).Sub(now)
}

// brokerReadings holds the last reading per resource.
type brokerReadings = perResource[*brokerReading]

func newBrokerReadings() *brokerReadings { return newPerResource[*brokerReading]() }

// readingKey identifies what a reading depends on: the rendered source and
// retention spec and the referenced Secrets' data.
func readingKey(s *scope) string {
	h := sha256.New()
	_ = json.NewEncoder(h).Encode(struct {
		Source    config.Source
		Retention config.Retention
		Delivery  config.Delivery
	}{s.rc.Config.Source, s.rc.Config.Retention, s.rc.Config.Delivery})
	h.Write([]byte(s.secrets.hash))
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// brokerPhase reads the broker, or reuses the last reading while it is
// fresh. It never fails the pass: the retention phase says what a failed
// read means for the window, BrokerLimits says Unknown.
func (r *Reconciler) brokerPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	now := r.opts.Clock.Now()
	key := readingKey(s)
	if last, _ := r.readings.get(s.key); last != nil && last.key == key && last.dueIn(now, r.opts.RetentionPeriod, r.opts.RecheckPeriod) > 0 {
		s.reading = last
	} else {
		rctx, cancel := context.WithTimeout(ctx, brokerTimeout)
		reading, err := r.opts.Broker.Observe(rctx, s.rc.Config, s.secrets.getenv, now)
		cancel()
		s.reading = &brokerReading{key: key, at: now, reading: reading, err: err}
		result := "ok"
		if s.reading.failedRead() {
			result = "error"
		}
		brokerReads.WithLabelValues(s.rc.Config.Source.Kind(), result).Inc()
		r.readings.put(s.key, s.reading)
	}
	observeLag(s, s.reading.reading.Lag)
	if s.reading.failedRead() {
		s.obs.brokerLimits = unknown(messagingv1alpha1.ReasonBrokerUnreachable, fmt.Sprintf("the broker was not read (%s); the limits are not known", errtext.Of(s.reading.err)))
	} else {
		observeBrokerLimits(s.idc, s.rc.Config, s.reading.reading.Result.Limits, &s.obs)
	}
	return ctrl.Result{}, nil
}
