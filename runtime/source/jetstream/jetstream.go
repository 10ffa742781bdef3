// Package jetstream is the NATS JetStream adapter: a durable pull consumer
// with explicit acknowledgements.
package jetstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// flushTimeout bounds the flush of buffered acknowledgements on Close.
const flushTimeout = 10 * time.Second

// Source consumes a JetStream durable pull consumer.
type Source struct {
	log      logr.Logger
	nc       *nats.Conn
	consumer jetstream.Consumer
	// ahead is the pull request sent for the next Fetch (nil when none is
	// out): sent or open (reqState). late is a waiting request given up
	// past its expiry that may still deliver: the next Fetch takes what it
	// delivered (nil when none; dropped once nats.go ends it). Fetch (one
	// goroutine at a time) and Close (after the last Fetch returned) touch
	// them.
	ahead, late *pullRequest
	// retired are late requests replaced by a newer one, each with a drain
	// giving back what it delivers; closing stops the drains, and Close
	// waits for them (drains).
	retiredMu sync.Mutex
	retired   []*pullRequest
	drains    sync.WaitGroup
	closing   chan struct{}
	closeOnce sync.Once
	// invalidMoves counts transitions the state machine does not allow
	// (a bug; the tests require none).
	invalidMoves atomic.Int64
	// timing is the pull timing for the server of timedFor (its version),
	// or what WithTiming set (timingSet).
	timing    Timing
	timedFor  string
	timingSet bool
	// lastPending is what the last message collect took reported pending
	// on the server after it: 0 means the request got everything there
	// was, more means it was cut short (MaxAckPending), and then a top-up
	// request would get nothing either.
	lastPending uint64
	// fixed is batching Fixed: an idle Fetch waits for a whole batch.
	fixed bool

	// confirmMu serializes ConfirmAcks; confirmedGen is the connection
	// (nats.Conn reconnect count) of the last round trip that confirmed
	// acknowledgements.
	confirmMu    sync.Mutex
	confirmedGen uint64
	// created is when the server created the durable consumer.
	created time.Time
}

var (
	_ source.Source        = (*Source)(nil)
	_ source.Confirmer     = (*Source)(nil)
	_ source.CreationTimer = (*Source)(nil)
)

// Option customises New.
type Option func(*options)

type options struct {
	clientName    string
	reconnectWait time.Duration
	// sizedAckPending is the MaxAckPending of a consumer the runtime
	// creates; minAckPending the least that fills every replica's batches.
	// Zero leaves the server default (1,000).
	sizedAckPending, minAckPending int
	batchSize                      int
	fixed                          bool
	// timing, when set, replaces the server's default pull timing.
	timing *Timing
}

// WithTiming replaces the pull timing the adapter picks for the server it
// connects to (DefaultTiming); for tests and measurements.
func WithTiming(t Timing) Option {
	return func(o *options) { o.timing = &t }
}

// WithDelivery sizes a consumer the runtime creates (and grows one it
// created earlier) to MaxAckPending = 4 x replicas x batchSize x inFlight,
// and reports an existing consumer whose limits cannot fill the declared
// replicas' batches.
func WithDelivery(d config.Delivery) Option {
	return func(o *options) {
		o.sizedAckPending = d.SizedUnacked(d.Replicas)
		o.minAckPending = d.MinUnacked(d.Replicas)
		o.batchSize = d.BatchSize
		o.fixed = d.Batching == config.BatchingFixed
	}
}

// CreatedByDescription marks a durable consumer the runtime created (in
// its description: consumer metadata needs NATS 2.10). Only such a consumer
// is resized by the runtime; one the user made is left as it is.
const CreatedByDescription = "created by idc-runtime (messaging.idempotency.dev); MaxAckPending sized for the declared replicas"

// WithClientName sets the NATS connection name shown by the server.
func WithClientName(name string) Option {
	return func(o *options) { o.clientName = name }
}

// WithReconnectWait sets the pause between reconnect attempts (default 2s).
func WithReconnectWait(d time.Duration) Option {
	return func(o *options) { o.reconnectWait = d }
}

// New connects to NATS and binds to the durable consumer cfg.Consumer on
// cfg.Stream. A missing consumer is created (explicit acks, cfg.FilterSubject);
// an existing one is used as it is, so user-set AckWait and MaxDeliver are
// kept.
func New(ctx context.Context, cfg *config.JetStream, logger logr.Logger, opts ...Option) (*Source, error) {
	o := options{clientName: "idc-runtime", reconnectWait: 2 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	log := logger.WithValues("stream", cfg.Stream, "consumer", cfg.Consumer)
	natsOpts, err := connectOptions(cfg, log, o)
	if err != nil {
		return nil, err
	}
	nc, js, err := brokerconn.ConnectJetStream(cfg.URL, natsOpts)
	if err != nil {
		return nil, err
	}
	consumer, err := bindConsumer(ctx, js, cfg, log, o)
	if err != nil {
		nc.Close()
		return nil, err
	}
	src := newSource(log, consumer, o)
	src.nc, src.confirmedGen = nc, nc.Stats().Reconnects
	if info := consumer.CachedInfo(); info != nil {
		src.created = info.Created
	}
	src.fitTiming()
	return src, nil
}

// newSource is a Source on consumer, without a connection until New sets
// one (the state machine's tests run it on a fake consumer).
func newSource(log logr.Logger, consumer jetstream.Consumer, o options) *Source {
	s := &Source{log: log, consumer: consumer, fixed: o.fixed, closing: make(chan struct{}), timing: DefaultTiming("")}
	if o.timing != nil {
		s.timing, s.timingSet = *o.timing, true
	}
	return s
}

func connectOptions(cfg *config.JetStream, log logr.Logger, o options) ([]nats.Option, error) {
	opts, err := brokerconn.NATSOptions(cfg.CredentialsEnv, cfg.TLS, nil,
		brokerconn.NATS{Name: o.clientName, Reconnect: true, ReconnectWait: o.reconnectWait})
	if err != nil {
		return nil, err
	}
	return append(opts,
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Info("disconnected from NATS, reconnecting", "error", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("reconnected to NATS", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Error(err, "asynchronous NATS error")
		}),
	), nil
}

// Ack acknowledges every message. It does not wait for the server: the
// acknowledgements go out in the connection's next write (nats.go's flusher
// writes as soon as the caller returns). So a nil error proves nothing:
// an acknowledgement lost on a half-open connection leaves the message
// pending on the server. ConfirmAcks proves them, off the hot path (a flush
// per batch, a PING/PONG round trip, kept each lane waiting about 0.6 ms
// per transaction). Acks made while the connection is down are buffered by
// nats.go and reported as an error (idc_ack_errors_total); ConfirmAcks
// sends them again once it is back.
func (s *Source) Ack(_ context.Context, msgs []source.Message) error {
	var errs []error
	if len(msgs) > 0 && !s.nc.IsConnected() {
		// Buffered until the connection is back, and sent then; the broker
		// may redeliver meanwhile. Said so, as a failed flush used to.
		errs = append(errs, fmt.Errorf("NATS is not connected (%s): %d acknowledgements are buffered until it reconnects", s.nc.Status(), len(msgs)))
	}
	for _, m := range msgs {
		jm, ok := m.Ref.(jetstream.Msg)
		if !ok {
			errs = append(errs, fmt.Errorf("message %s was not fetched from JetStream", m.NativeID))
			continue
		}
		if err := jm.Ack(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			errs = append(errs, fmt.Errorf("while acknowledging %s: %w", m.NativeID, err))
		}
	}
	return errors.Join(errs...)
}

// Close gives back the batch requested ahead and what the requests given
// up delivered, waits for every drain it started (no goroutine of the
// adapter outlives it), flushes and closes the connection. Other
// unacknowledged messages (fetched, not committed) are redelivered by the
// server after the consumer's AckWait. A failed flush is returned:
// acknowledgements may have been lost with it, so the stop is not graceful.
func (s *Source) Close() error {
	s.giveBackLate()
	s.giveBackAhead()
	s.stopDrains()
	if s.nc == nil {
		return nil
	}
	err := s.nc.FlushTimeout(flushTimeout)
	s.nc.Close()
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("while flushing the last acknowledgements before closing the NATS connection: %w", err)
	}
	return nil
}
