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

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
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

func (s *Source) connect() (*session, error) {
	uri, _, err := brokerconn.AMQPURI(s.cfg.URIEnv, nil)
	if err != nil {
		return nil, err
	}
	dial, err := brokerconn.AMQPConfig(s.cfg.TLS, nil, brokerconn.AMQP{ConnectionName: s.opts.connectionName, Heartbeat: s.opts.heartbeat})
	if err != nil {
		return nil, err
	}
	conn, err := amqp.DialConfig(uri, dial)
	if err != nil {
		return nil, fmt.Errorf("while connecting to RabbitMQ: %w", err)
	}
	sess, err := s.open(conn)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return sess, nil
}

func (s *Source) open(conn *amqp.Connection) (*session, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("while opening a RabbitMQ channel: %w", err)
	}
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("while setting prefetch %d: %w", s.cfg.Prefetch, err)
	}
	deliveries, err := ch.Consume(s.queue, s.opts.consumerTag, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("while consuming queue %s: %w", s.queue, err)
	}
	s.gen++
	sess := &session{
		gen: s.gen, conn: conn, ch: ch,
		buf:      make(chan amqp.Delivery, max(s.cfg.Prefetch, 1)),
		pending:  map[uint64]struct{}{},
		deferred: map[uint64]time.Time{},
		done:     make(chan struct{}),
	}
	// The library hands deliveries over an unbuffered channel; pumping them
	// into buf lets Fetch drain what has arrived without racing the
	// library's goroutine.
	go sess.pump(deliveries)
	return sess, nil
}

func (sess *session) pump(deliveries <-chan amqp.Delivery) {
	defer close(sess.buf)
	for d := range deliveries {
		select {
		case sess.buf <- d:
		case <-sess.done:
			return
		}
	}
}

// ensureSession reconnects when the last session was lost, pausing with an
// exponential backoff between failed attempts.
func (s *Source) ensureSession(ctx context.Context) (*session, error) {
	s.mu.Lock()
	sess := s.session
	s.mu.Unlock()
	if sess != nil {
		return sess, nil
	}
	if wait := s.nextDial.Sub(s.opts.clock.Now()); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	sess, err := s.connect()
	if err != nil {
		s.backoff = min(max(2*s.backoff, minBackoff), maxBackoff)
		s.nextDial = s.opts.clock.Now().Add(s.backoff)
		return nil, fmt.Errorf("while reconnecting to RabbitMQ: %w", err)
	}
	s.backoff = 0
	s.mu.Lock()
	s.session = sess
	s.mu.Unlock()
	s.log.Info("reconnected to RabbitMQ")
	return sess, nil
}

// drop forgets a lost session; the next Fetch reconnects.
func (s *Source) drop(sess *session, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked(sess, reason)
}

func (s *Source) dropLocked(sess *session, reason string) {
	if s.session != sess {
		return
	}
	s.log.Info("RabbitMQ session lost, reconnecting on the next fetch", "reason", reason)
	s.session = nil
	_ = sess.close()
}

// Fetch waits up to maxWait for a first delivery, then takes what else has
// already arrived, up to maxN. When that is less than maxN and the queue
// holds messages the broker has not delivered yet (its ready count, one
// passive queue.declare), it keeps taking deliveries as they arrive, up to
// maxN, waiting at most fillGap for each next one and max(maxWait,
// fillGap) for the fill, and never past the prefetch window (nothing more
// arrives until the deliveries held are acknowledged). With nothing ready
// it returns at once, so a lone message at low load is not held. The
// worst case, a slow ready count under a backlog, holds a fetch for about
// three times maxWait: the first delivery, the ready count's round trip
// (bounded by max(maxWait, fillGap)) and the fill.
//
// Why: the broker pushes deliveries one by one as fast as its queue
// process goes, so a fetch that took only what had arrived when the first
// delivery came got a few messages under a backlog too (measured, 2 x 500
// on a classic queue of 100,000: 13 messages per transaction), and the
// replicas' and PostgreSQL's cost per transaction took the CPU the broker
// needed. Fetch is not safe for concurrent use (the loop has one fetcher).
func (s *Source) Fetch(ctx context.Context, maxN int, maxWait time.Duration) ([]source.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sess, err := s.ensureSession(ctx)
	if err != nil || maxN <= 0 {
		return nil, err
	}
	first, ok, err := s.waitFirst(ctx, sess, maxWait)
	if err != nil || !ok {
		return nil, err
	}
	ds, open := drain(sess.buf, []amqp.Delivery{first}, maxN)
	if open && len(ds) < maxN {
		ds, open = s.fill(ctx, sess, ds, maxN, maxWait)
	}
	if !open || sess.ch.IsClosed() {
		// These deliveries cannot be acknowledged; the broker requeues them.
		s.drop(sess, "channel closed")
		return nil, fmt.Errorf("while fetching from queue %s: channel closed", s.queue)
	}
	return s.messages(sess, ds), nil
}

// fillGap bounds the wait for each next delivery of a backlog: a batch
// fills from it, but a broker that has stopped delivering (another
// consumer took the rest, or it is busy) is not waited for longer.
const fillGap = 50 * time.Millisecond

// readyZeroTTL is how long a ready count of zero is believed: a fetch
// within it does not ask again. It bounds the queries at low load, where
// every fetch is short and the answer is always zero (the broker delivers
// each message as it comes while the prefetch windows have room).
const readyZeroTTL = 10 * time.Millisecond

// fill takes more deliveries while the queue holds a backlog (see Fetch);
// open is false when buf was closed.
func (s *Source) fill(ctx context.Context, sess *session, ds []amqp.Delivery, maxN int, fillFor time.Duration) (_ []amqp.Delivery, open bool) {
	backlog := s.backlog(ctx, sess, fillFor)
	if backlog == 0 {
		return ds, true
	}
	// The ready count leaves out what the broker has sent and this
	// channel not yet received, so it only says that more is coming:
	// the batch fills to maxN, bounded by the window and the waits.
	want := maxN
	until := s.opts.fillClock.NewTimer(max(fillFor, fillGap))
	defer until.Stop()
	gap := s.opts.fillClock.NewTimer(fillGap)
	defer gap.Stop()
	for {
		if ds, open = drain(sess.buf, ds, want); !open {
			return ds, false
		}
		if len(ds) >= want || s.windowFull(sess, len(ds)) {
			return ds, true
		}
		gap.Reset(fillGap)
		select {
		case d, ok := <-sess.buf:
			if !ok {
				return ds, false
			}
			ds = append(ds, d)
		case <-gap.C():
			return ds, true
		case <-until.C():
			return ds, true
		case <-ctx.Done():
			return ds, true // the caller sees ctx end and leaves them unacked
		}
	}
}

// windowFull reports whether the deliveries this channel holds
// unacknowledged (fetched, deferred and in hand) fill the prefetch
// window: the broker sends nothing more until some are acknowledged.
func (s *Source) windowFull(sess *session, inHand int) bool {
	if s.cfg.Prefetch <= 0 {
		return false // no window
	}
	s.mu.Lock()
	held := len(sess.pending) + len(sess.deferred)
	s.mu.Unlock()
	return held+inHand >= s.cfg.Prefetch
}

// backlog is the queue's ready count (messages not yet delivered to any
// consumer) from a passive queue.declare, 0 when it is not known: a query
// that fails, or takes longer than wait, counts as no backlog. (It fails
// only when the queue is gone, which closes the channel; the caller sees
// that.)
func (s *Source) backlog(ctx context.Context, sess *session, wait time.Duration) int {
	now := time.Now()
	if now.Before(s.readyZeroUntil) || !s.asking.CompareAndSwap(false, true) {
		return 0
	}
	ready := make(chan int, 1)
	go func() {
		defer s.asking.Store(false)
		sess.rpc.Lock()
		q, err := sess.ch.QueueDeclarePassive(s.queue, true, false, false, false, nil)
		sess.rpc.Unlock()
		if err != nil {
			s.log.V(1).Info("could not read the queue's ready count; taking what has arrived", "error", err.Error())
			ready <- 0
			return
		}
		ready <- q.Messages
	}()
	t := s.opts.fillClock.NewTimer(max(wait, fillGap))
	defer t.Stop()
	n := 0
	select {
	case n = <-ready:
	case <-t.C():
	case <-ctx.Done():
	}
	if n == 0 {
		s.readyZeroUntil = now.Add(readyZeroTTL)
	}
	return n
}

// drain appends what has already arrived, up to maxN deliveries; open is
// false when buf was closed.
func drain(buf <-chan amqp.Delivery, ds []amqp.Delivery, maxN int) (_ []amqp.Delivery, open bool) {
	for len(ds) < maxN {
		select {
		case d, ok := <-buf:
			if !ok {
				return ds, false
			}
			ds = append(ds, d)
		default:
			return ds, true
		}
	}
	return ds, true
}

func (s *Source) waitFirst(ctx context.Context, sess *session, maxWait time.Duration) (amqp.Delivery, bool, error) {
	t := time.NewTimer(maxWait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return amqp.Delivery{}, false, ctx.Err()
	case <-t.C:
		return amqp.Delivery{}, false, nil
	case d, open := <-sess.buf:
		if !open {
			s.drop(sess, "channel closed")
			return d, false, fmt.Errorf("while fetching from queue %s: channel closed", s.queue)
		}
		return d, true, nil
	}
}

func (s *Source) messages(sess *session, ds []amqp.Delivery) []source.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.clock.Now()
	msgs := make([]source.Message, len(ds))
	for i, d := range ds {
		sess.pending[d.DeliveryTag] = struct{}{}
		msgs[i] = convert(d, now)
		msgs[i].Ref = ref{gen: sess.gen, tag: d.DeliveryTag}
	}
	return msgs
}

// maxAckDelay is how long an acknowledged delivery may wait behind an older
// one still in flight before it is acknowledged on its own.
const maxAckDelay = time.Second

// Ack acknowledges the deliveries of the current channel. Lanes commit out
// of order, so their tags interleave; acknowledging each tag on its own
// costs the broker one frame per message. Instead a tag acknowledged while
// an older one is still pending is deferred, and everything below the
// oldest pending tag goes as ONE multiple-ack (exact: every tag below it was
// acknowledged by the caller). A deferred tag that waited maxAckDelay is
// sent on its own, so a slow lane never holds the others' acks for long;
// Close sends what is left. A deferred ack lost with its channel is only a
// redelivery, which the inbox settles as a duplicate.
// Deliveries from an earlier channel yield ErrStaleDelivery.
func (s *Source) Ack(_ context.Context, msgs []source.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var tags []uint64
	stale := 0
	for _, m := range msgs {
		r, ok := m.Ref.(ref)
		if !ok {
			return fmt.Errorf("message %q was not fetched from RabbitMQ", m.NativeID)
		}
		if s.session == nil || r.gen != s.session.gen {
			stale++
			continue
		}
		tags = append(tags, r.tag)
	}
	var errs []error
	if stale > 0 {
		errs = append(errs, fmt.Errorf("%d of %d deliveries: %w", stale, len(msgs), ErrStaleDelivery))
	}
	if len(tags) > 0 {
		if err := s.ackTags(s.session, tags, s.opts.clock.Now()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Source) ackTags(sess *session, tags []uint64, now time.Time) error {
	for _, tag := range tags {
		if _, ok := sess.pending[tag]; ok {
			delete(sess.pending, tag)
			sess.deferred[tag] = now
		}
	}
	watermark := oldestPending(sess.pending)
	var below uint64
	found := false
	var overdue []uint64
	for tag, at := range sess.deferred {
		switch {
		case tag < watermark:
			below, found = max(below, tag), true
		case now.Sub(at) >= maxAckDelay:
			overdue = append(overdue, tag)
		}
	}
	if found {
		if err := sess.ch.Ack(below, true); err != nil {
			s.dropLocked(sess, "acknowledgement failed")
			return fmt.Errorf("while acknowledging deliveries up to tag %d: %w", below, err)
		}
		for tag := range sess.deferred {
			if tag <= below {
				delete(sess.deferred, tag)
			}
		}
	}
	return s.ackEach(sess, overdue)
}

// ackEach acknowledges deferred tags one by one.
func (s *Source) ackEach(sess *session, tags []uint64) error {
	slices.Sort(tags)
	for _, tag := range tags {
		if err := sess.ch.Ack(tag, false); err != nil {
			s.dropLocked(sess, "acknowledgement failed")
			return fmt.Errorf("while acknowledging delivery %d: %w", tag, err)
		}
		delete(sess.deferred, tag)
	}
	return nil
}

// oldestPending is the smallest outstanding tag (MaxUint64 when none): a
// multiple-ack up to a run's last tag is exact only when no outstanding
// tag is older than the run's first. Deliveries still buffered, not yet
// fetched, always have larger tags than every fetched one.
func oldestPending(pending map[uint64]struct{}) uint64 {
	oldest := ^uint64(0)
	for tag := range pending {
		oldest = min(oldest, tag)
	}
	return oldest
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
