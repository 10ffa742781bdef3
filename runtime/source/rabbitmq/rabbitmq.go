// Package rabbitmq is the RabbitMQ adapter: one consumer on a queue the user
// owns, with prefetch and manual acknowledgements. It reconnects on its own
// on the Fetch after a connection or channel loss.
package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/utils/clock"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// ErrStaleDelivery is returned (wrapped) by Ack for deliveries received on a
// channel that has closed since: they cannot be acknowledged any more, and
// the broker redelivers them.
var ErrStaleDelivery = errors.New("delivery came from a closed channel; the broker redelivers it")

const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 30 * time.Second
)

// Source consumes one queue.
type Source struct {
	log   logr.Logger
	cfg   config.RabbitMQ
	opts  options
	queue string

	// mu guards session, gen and the session's pending set: Ack runs
	// concurrently with Fetch. It is not held while Fetch waits.
	mu sync.Mutex
	// session is the live connection and channel; nil while disconnected.
	session *session
	// gen numbers sessions so Ack can tell stale deliveries apart.
	gen uint64

	backoff  time.Duration
	nextDial time.Time
	// readyZeroUntil is when the last ready count of zero stops being
	// believed (see backlog); only Fetch uses it.
	readyZeroUntil time.Time
	// asking is set while a ready-count query is outstanding (one that
	// outlived its fetch is not doubled).
	asking atomic.Bool
}

// session is one connection, its channel and its deliveries.
type session struct {
	gen  uint64
	conn *amqp.Connection
	ch   *amqp.Channel
	// buf holds deliveries pumped from the consumer; closed when the channel
	// closes.
	buf chan amqp.Delivery
	// pending holds the tags fetched and not yet acknowledged.
	pending map[uint64]struct{}
	// deferred holds tags the caller acknowledged that are not sent yet
	// because an older tag is still pending (see Ack), with the time each
	// was acknowledged.
	deferred map[uint64]time.Time
	// done stops the pump when the session is dropped.
	done chan struct{}
	// rpc serializes the synchronous methods on ch (the backlog's passive
	// queue.declare, ConfirmAcks' basic.qos): amqp091 hands a reply to
	// whichever caller waits first.
	rpc sync.Mutex
}

// close stops the pump and closes the connection (and so the channel).
func (sess *session) close() error {
	close(sess.done)
	return sess.conn.Close()
}

// ref is the Message.Ref of a delivery.
type ref struct {
	gen uint64
	tag uint64
}

var (
	_ source.Source    = (*Source)(nil)
	_ source.Confirmer = (*Source)(nil)
)

// Option customises New.
type Option func(*options)

type options struct {
	connectionName string
	consumerTag    string
	heartbeat      time.Duration
	// clock dates deliveries, acknowledgements (maxAckDelay) and the
	// reconnect backoff.
	clock clock.PassiveClock
	// fillClock runs the fill's timers (fillGap, the fill's bound and the
	// ready count's wait); tests pass a fake one, so that a pause of the
	// broker on a loaded machine cannot end a fill they look at.
	fillClock clock.Clock
}

// WithConnectionName sets the connection name shown by the broker.
func WithConnectionName(name string) Option {
	return func(o *options) { o.connectionName = name }
}

// WithClock sets the clock the source reads the time from (default: the
// system clock); tests pass a fake one to move past maxAckDelay.
func WithClock(c clock.PassiveClock) Option {
	return func(o *options) { o.clock = c }
}

// WithConsumerTag sets the consumer tag (default: generated).
func WithConsumerTag(tag string) Option {
	return func(o *options) { o.consumerTag = tag }
}

// New connects to the broker and starts consuming cfg.Queue, which must
// exist. The URI is read from the environment variable cfg.URIEnv.
func New(_ context.Context, cfg *config.RabbitMQ, logger logr.Logger, opts ...Option) (*Source, error) {
	o := options{connectionName: "idc-runtime", heartbeat: 10 * time.Second, clock: clock.RealClock{}, fillClock: clock.RealClock{}}
	for _, opt := range opts {
		opt(&o)
	}
	s := &Source{log: logger.WithValues("queue", cfg.Queue), cfg: *cfg, opts: o, queue: cfg.Queue}
	sess, err := s.connect()
	if err != nil {
		return nil, err
	}
	s.session = sess
	return s, nil
}

// Close closes the connection; the broker requeues unacknowledged
// deliveries.
func (s *Source) Close() error {
	s.mu.Lock()
	sess := s.session
	s.session = nil
	var flushErr error
	if sess != nil && len(sess.deferred) > 0 {
		// What the caller acknowledged is sent before the channel goes.
		flushErr = s.ackEach(sess, slices.Collect(maps.Keys(sess.deferred)))
	}
	s.mu.Unlock()
	if sess == nil {
		return nil
	}
	if err := sess.close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return errors.Join(flushErr, fmt.Errorf("while closing the RabbitMQ connection: %w", err))
	}
	if flushErr != nil {
		return fmt.Errorf("sending the deferred acknowledgements failed; the broker redelivers them: %w", flushErr)
	}
	return nil
}
