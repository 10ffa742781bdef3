package consumer

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// Dead-letter reason classes: the bounded label values of idc_dead_letters_total.
const (
	ReasonMissingID   = "missing_id"
	ReasonInvalidID   = "invalid_id"
	ReasonInvalidJSON = "invalid_json"
	ReasonEvaluation  = "evaluation"
	ReasonDatabase    = "database"
	ReasonHTTP        = "http"
	// ReasonIDConflict: a duplicate id with a different payload, under
	// message.id.onPayloadMismatch: DeadLetter.
	ReasonIDConflict = "id_conflict"
	// ReasonOutboxRejected: an outbox event the emit target can never take
	// (the relay's; the http dispatcher's give-ups are ReasonHTTP).
	ReasonOutboxRejected = inbox.OutboxRejectedClass
)

// DeadLetterReasons lists every reason class, so each series exists (at 0)
// from the start and increase() sees the first dead letter. It is also what
// redrive's --reason and the redrive-reason annotation accept
// (inbox.DeadLetterClasses, kept equal by a test).
var DeadLetterReasons = []string{ReasonMissingID, ReasonInvalidID, ReasonInvalidJSON, ReasonEvaluation, ReasonDatabase, ReasonHTTP, ReasonIDConflict, ReasonOutboxRejected}

// Metrics are the consumer's Prometheus metrics (prefix idc_).
type Metrics struct {
	Messages          prometheus.Counter
	DuplicatesSkipped prometheus.Counter
	StaleRefused      prometheus.Counter
	DeadLetters       *prometheus.CounterVec
	AckErrors         prometheus.Counter
	BatchDuration     prometheus.Histogram
	CommitDuration    prometheus.Histogram
	InboxRows         prometheus.Gauge
	OldestInboxRowAge prometheus.Gauge
	// SinkMisconfigured is 1 for the reason the loop holds on (see
	// SinkReasons), 0 for the others and whenever it does not hold.
	SinkMisconfigured *prometheus.GaugeVec
	// IDConflicts counts duplicates whose payload fingerprint differs from
	// the claimed one (a producer reusing an id), whatever the policy.
	IDConflicts prometheus.Counter
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Messages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idc_messages_total", Help: "Messages settled (applied, skipped or dead-lettered) and acknowledged.",
		}),
		DuplicatesSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idc_duplicates_skipped_total", Help: "Messages skipped because their id was already in the inbox or repeated in the batch.",
		}),
		StaleRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idc_stale_refused_total", Help: "Updates refused by the sequence gate or superseded within their batch.",
		}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idc_dead_letters_total", Help: "Messages written to the dead-letter table, by reason class.",
		}, []string{"reason"}),
		AckErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idc_ack_errors_total", Help: "Batches whose acknowledgement failed after commit (the broker redelivers; the inbox dedupes).",
		}),
		BatchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "idc_batch_duration_seconds", Help: "Time from fetch to acknowledgement of a batch.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		CommitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "idc_commit_duration_seconds", Help: "Time spent in COMMIT.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		InboxRows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idc_inbox_rows", Help: "Estimated rows in the inbox table.",
		}),
		OldestInboxRowAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idc_oldest_inbox_row_age_seconds", Help: "Age of the oldest inbox row (processed_at).",
		}),
		SinkMisconfigured: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idc_sink_misconfigured", Help: "1 while the consumer holds because the sink is misconfigured (no fetch, no ack, no dead letter), by reason.",
		}, []string{"reason"}),
		IDConflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idc_id_conflicts_total", Help: "Duplicate ids whose payload fingerprint differs from the claimed one (a producer reused an id for a different event).",
		}),
	}
	for _, r := range SinkReasons {
		m.SinkMisconfigured.WithLabelValues(r).Set(0)
	}
	for _, r := range DeadLetterReasons {
		m.DeadLetters.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{m.Messages, m.DuplicatesSkipped, m.StaleRefused, m.DeadLetters,
		m.AckErrors, m.BatchDuration, m.CommitDuration, m.InboxRows, m.OldestInboxRowAge, m.SinkMisconfigured, m.IDConflicts} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("while registering consumer metrics: %w", err)
		}
	}
	return m, nil
}
