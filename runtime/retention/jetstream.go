package retention

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// JetStream server defaults for a consumer created without AckWait and
// MaxDeliver, which is how the runtime creates a missing consumer.
const (
	jsDefaultAckWait    = 30 * time.Second
	jsDefaultMaxDeliver = -1
)

type jetStreamInspector struct {
	cfg    *config.JetStream
	getenv Getenv
	dial   brokerconn.Dialer
}

// jetStreamSession is one NATS connection without reconnects.
type jetStreamSession struct {
	cfg *config.JetStream
	nc  *nats.Conn
	js  jetstream.JetStream
	// checked: the stream was found partitioned as configured (read once
	// per session); partitions is the last partitionLags reading.
	checked    bool
	partitions []PartitionLag
}

// wholePartitioned: the config is partitioned and not one partition's view
// (config.JetStream.ForPartition): its readings span every partition.
func (j *jetStreamSession) wholePartitioned() bool {
	return j.cfg.Partitioned() && !j.cfg.OnePartition
}

// limitsConsumer is the durable whose limits (AckWait, MaxDeliver, BackOff)
// the window is derived from: partition 0's of a partitioned config (the
// runtime creates every partition's alike), else the configured one.
func (j *jetStreamSession) limitsConsumer() string {
	if j.wholePartitioned() {
		return config.PartitionConsumer(j.cfg.Consumer, 0)
	}
	return j.cfg.Consumer
}

// checkPartitioned checks, once per session, that the server and the stream
// can be read in cfg.Partitions partitions (PartitionsSupported,
// PartitionFilter); when not, the error wraps ErrSourceNotFound (the source
// as configured is not on the broker) and says what to change.
func (j *jetStreamSession) checkPartitioned(ctx context.Context) error {
	if j.checked || !j.wholePartitioned() {
		return nil
	}
	st, err := j.stream(ctx)
	if err != nil {
		return err
	}
	return j.checkStream(st)
}

func (j *jetStreamSession) checkStream(st jetstream.StreamConfig) error {
	if !j.wholePartitioned() {
		return nil
	}
	if err := PartitionsSupported(j.nc.ConnectedServerVersion()); err != nil {
		return notPartitioned{fmt.Errorf("JetStream stream %s: %w", j.cfg.Stream, err)}
	}
	if _, err := PartitionFilter(st, j.cfg.Partitions, 0); err != nil {
		return notPartitioned{err}
	}
	j.checked = true
	return nil
}

func (j *jetStreamInspector) open(context.Context) (session, error) {
	opts, err := brokerconn.NATSOptions(j.cfg.CredentialsEnv, j.cfg.TLS, j.getenv,
		brokerconn.NATS{Name: "idc-retention", Timeout: 5 * time.Second, Dial: j.dial})
	if err != nil {
		return nil, err
	}
	nc, js, err := brokerconn.ConnectJetStream(j.cfg.URL, opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBrokerUnreachable, err)
	}
	return &jetStreamSession{cfg: j.cfg, nc: nc, js: js}, nil
}

func (j *jetStreamSession) close() { j.nc.Close() }

// inspect reads the stream's MaxAge and retention policy and the durable
// consumer's AckWait, MaxDeliver and BackOff.
func (j *jetStreamSession) inspect(ctx context.Context) (Observation, error) {
	st, err := j.stream(ctx)
	if err != nil {
		return Observation{}, err
	}
	if err := j.checkStream(st); err != nil {
		return Observation{}, err
	}
	cc, fact, err := j.consumer(ctx)
	if err != nil {
		return Observation{}, err
	}
	obs := jetStreamObservation(j.cfg.Stream, st, cc, fact)
	obs.Limits.MaxAckPending = cc.MaxAckPending // 0 when the consumer does not exist yet
	return obs, nil
}

func (j *jetStreamSession) stream(ctx context.Context) (jetstream.StreamConfig, error) {
	s, err := j.js.Stream(ctx, j.cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return jetstream.StreamConfig{}, fmt.Errorf("%w: JetStream stream %s: %w", ErrSourceNotFound, j.cfg.Stream, err)
	case jsUnreachable(err):
		return jetstream.StreamConfig{}, unreachable("reading JetStream stream "+j.cfg.Stream, err)
	case err != nil:
		return jetstream.StreamConfig{}, fmt.Errorf("while reading JetStream stream %s: %w", j.cfg.Stream, err)
	}
	return s.CachedInfo().Config, nil
}

// consumer returns the durable consumer's config, or the server defaults
// (and a fact saying so) when it does not exist yet.
//
// Of a partitioned config it is partition 0's durable (limitsConsumer),
// and the fact says so.
func (j *jetStreamSession) consumer(ctx context.Context) (jetstream.ConsumerConfig, string, error) {
	name := j.limitsConsumer()
	of := ""
	if j.wholePartitioned() {
		of = fmt.Sprintf(" (partition 0 of %d, its limits those of every partition)", j.cfg.Partitions)
	}
	c, err := j.js.Consumer(ctx, j.cfg.Stream, name)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		cc := jetstream.ConsumerConfig{AckWait: jsDefaultAckWait, MaxDeliver: jsDefaultMaxDeliver}
		return cc, fmt.Sprintf("consumer %s%s does not exist yet: JetStream defaults ack_wait=%s max_deliver=%d backoff=[]",
			name, of, FormatDuration(cc.AckWait), cc.MaxDeliver), nil
	case jsUnreachable(err):
		return jetstream.ConsumerConfig{}, "", unreachable("reading JetStream consumer "+name, err)
	case err != nil:
		return jetstream.ConsumerConfig{}, "", fmt.Errorf("while reading JetStream consumer %s on stream %s: %w", name, j.cfg.Stream, err)
	}
	cc := c.CachedInfo().Config
	return cc, fmt.Sprintf("consumer %s%s ack_wait=%s max_deliver=%d backoff=%s (broker)",
		name, of, FormatDuration(cc.AckWait), cc.MaxDeliver, formatDurations(cc.BackOff)), nil
}

// jsUnreachable: the server did not answer (timeouts, no JetStream
// responders, a dropped connection).
func jsUnreachable(err error) bool {
	return err != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, nats.ErrConnectionClosed))
}

// jetStreamObservation applies the JetStream rules:
//   - L = MaxAge (0 → ∞), whatever the retention policy;
//   - A = Σ over MaxDeliver attempts of the lease: AckWait, or BackOff[i]
//     (its last value repeating) when BackOff is set; MaxDeliver -1 → ∞;
//   - replay: limits retention keeps consumed messages, so a consumer reset
//     reaches MaxAge back (0 → ∞); workqueue and interest retention remove a
//     message once acknowledged, so nothing is replayed beyond redelivery.
func jetStreamObservation(stream string, st jetstream.StreamConfig, cc jetstream.ConsumerConfig, consumerFact string) Observation {
	life := Infinite()
	if st.MaxAge > 0 {
		life = Finite(st.MaxAge)
	}
	leases := []time.Duration{cc.AckWait}
	if len(cc.BackOff) > 0 {
		leases = cc.BackOff
	}
	replay := life
	if st.Retention == jetstream.WorkQueuePolicy || st.Retention == jetstream.InterestPolicy {
		replay = Finite(0)
	}
	return Observation{
		Life:     life,
		Attempts: Attempts{Max: cc.MaxDeliver, Leases: leases},
		Replay:   replay,
		Facts: []string{
			fmt.Sprintf("stream %s max_age=%s retention=%s (broker)", stream, formatMaxAge(st.MaxAge), retentionName(st.Retention)),
			consumerFact,
		},
	}
}

func formatMaxAge(d time.Duration) string {
	if d <= 0 {
		return "0 (unlimited)"
	}
	return FormatDuration(d)
}

func retentionName(p jetstream.RetentionPolicy) string {
	switch p {
	case jetstream.LimitsPolicy:
		return "limits"
	case jetstream.InterestPolicy:
		return "interest"
	case jetstream.WorkQueuePolicy:
		return "workqueue"
	}
	return fmt.Sprintf("unknown(%d)", int(p))
}

func formatDurations(ds []time.Duration) string {
	s := "["
	for i, d := range ds {
		if i > 0 {
			s += ","
		}
		s += FormatDuration(d)
	}
	return s + "]"
}
