// Package jetstream is the NATS JetStream adapter: a durable pull consumer
// with explicit acknowledgements.
package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
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
	// out) and aheadN its size. Fetch (one goroutine at a time) and Close
	// (after the last Fetch returned) touch them.
	ahead  jetstream.MessageBatch
	aheadN int
	// aheadOpen says the request ahead is a waiting one (sent while idle,
	// batching Adaptive): it stays open after some of its messages were
	// taken, so a Fetch takes what it delivered so far instead of waiting
	// for it to complete.
	aheadOpen bool
	// aheadTaken is how many messages of the open request were taken.
	aheadTaken int
	// aheadUntil is, for a waiting request (a long poll), a time by which
	// the server has expired it for sure; past it the request is given up
	// (see expiryGrace). Zero for a no-wait request, which does not expire.
	aheadUntil time.Time
	// late is a waiting request given up past its expiry that may still
	// deliver (it was late, not dropped): the next Fetch takes what it
	// delivered. nil when none; it is dropped once nats.go ends it.
	late jetstream.MessageBatch
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
	src := &Source{log: log, nc: nc, consumer: consumer, fixed: o.fixed, confirmedGen: nc.Stats().Reconnects}
	if info := consumer.CachedInfo(); info != nil {
		src.created = info.Created
	}
	return src, nil
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

// bindConsumer looks the durable consumer up and creates it only when it
// does not exist, so settings made by the user are never overwritten.
func bindConsumer(ctx context.Context, js jetstream.JetStream, cfg *config.JetStream, log logr.Logger, o options) (jetstream.Consumer, error) {
	c, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	if err == nil {
		if err := checkExisting(c.CachedInfo(), cfg, log); err != nil {
			return nil, err
		}
		return fitExisting(ctx, js, c, cfg, log, o)
	}
	if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("while looking up JetStream consumer %s on stream %s: %w", cfg.Consumer, cfg.Stream, err)
	}
	c, err = js.CreateConsumer(ctx, cfg.Stream, newConsumerConfig(cfg, o))
	if errors.Is(err, jetstream.ErrConsumerExists) {
		// Another replica created it in the meantime.
		return bindConsumer(ctx, js, cfg, log, o)
	}
	if err != nil {
		return nil, fmt.Errorf("while creating JetStream consumer %s on stream %s: %w", cfg.Consumer, cfg.Stream, err)
	}
	log.Info("created JetStream durable consumer", "filterSubject", cfg.FilterSubject, "maxAckPending", c.CachedInfo().Config.MaxAckPending)
	return c, nil
}

// newConsumerConfig is the durable consumer the runtime creates: explicit
// acks, the whole stream, and MaxAckPending sized for the declared replicas.
func newConsumerConfig(cfg *config.JetStream, o options) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		FilterSubject: cfg.FilterSubject,
		MaxAckPending: o.sizedAckPending,
		Description:   CreatedByDescription,
	}
}

// fitExisting grows MaxAckPending of a consumer the runtime created when the
// declared scale outgrew it (replicas were added), and logs a warning for a
// user-made consumer whose limits cannot fill every replica's batches (the
// controller reports the same in the BrokerLimits condition).
func fitExisting(ctx context.Context, js jetstream.JetStream, c jetstream.Consumer, cfg *config.JetStream, log logr.Logger, o options) (jetstream.Consumer, error) {
	info := c.CachedInfo()
	if info == nil || o.sizedAckPending == 0 {
		return c, nil
	}
	cc := info.Config
	if cc.Description == CreatedByDescription {
		// The runtime's own: sized for the declared scale with headroom
		// (the batches requested ahead), grown whenever it is below that.
		if !AckPendingTooSmall(cc.MaxAckPending, o.sizedAckPending) {
			return c, nil
		}
	} else {
		if !AckPendingTooSmall(cc.MaxAckPending, o.minAckPending) {
			return c, nil
		}
		log.Info("WARNING: the existing JetStream consumer's MaxAckPending cannot fill every replica's batches; throughput is capped by it",
			"maxAckPending", cc.MaxAckPending, "needed", o.minAckPending)
		return c, nil
	}
	cc.MaxAckPending = o.sizedAckPending
	updated, err := js.UpdateConsumer(ctx, cfg.Stream, cc)
	if err != nil {
		// Not fatal: it only limits throughput.
		log.Error(err, "could not grow MaxAckPending of the runtime's JetStream consumer", "maxAckPending", o.sizedAckPending)
		return c, nil
	}
	log.Info("grew MaxAckPending of the runtime's JetStream consumer to the declared scale", "maxAckPending", o.sizedAckPending)
	return updated, nil
}

// AckPendingTooSmall reports whether a consumer's MaxAckPending (-1 or 0:
// unlimited) is below needed.
func AckPendingTooSmall(maxAckPending, needed int) bool {
	return maxAckPending > 0 && maxAckPending < needed
}

func checkExisting(info *jetstream.ConsumerInfo, cfg *config.JetStream, log logr.Logger) error {
	if info == nil {
		return nil
	}
	c := info.Config
	if c.AckPolicy == jetstream.AckNonePolicy {
		return fmt.Errorf("JetStream consumer %s on stream %s has AckPolicy none; the runtime needs explicit acknowledgements", cfg.Consumer, cfg.Stream)
	}
	if c.DeliverSubject != "" {
		return fmt.Errorf("JetStream consumer %s on stream %s is a push consumer; the runtime needs a pull consumer", cfg.Consumer, cfg.Stream)
	}
	if cfg.FilterSubject != "" && c.FilterSubject != cfg.FilterSubject {
		log.Info("existing JetStream consumer has a different filter subject; using it unchanged",
			"configured", cfg.FilterSubject, "existing", c.FilterSubject, "existingFilters", c.FilterSubjects)
	}
	return nil
}

// Fetch returns up to maxN messages.
//
// It first takes what is available right away (a no-wait pull request, or
// the request sent ahead by the previous Fetch); a backlog fills the batch.
// When nothing is available it waits, at most maxWait:
//   - batching Adaptive (the default): for the first message, which it
//     returns with whatever else has arrived by then, from a waiting
//     request that stays open for the next Fetch if it has more to give;
//   - batching Fixed (the loop before adaptive batching): for a whole batch.
//
// A waiting request is not waited on past its expiry (see expiryGrace):
// it is given up, and what it still delivers is taken by a later Fetch
// (checked each time a Fetch starts or its wait ends, not while it waits).
//
// A Fetch that returns messages sends the pull request of the next Fetch
// before it returns (one request ahead, no-wait, the same size), so the
// next batch travels while the caller commits this one: a fetch's round
// trip and the server's work on it are off the loop's path. The batch
// ahead is at most one more batch delivered and not yet acknowledged; the
// runtime sizes MaxAckPending for it (config.Delivery.SizedUnacked). Close
// gives it back (NAK). While the loop holds on a misconfigured sink it sits
// delivered: past AckWait the server redelivers its messages, and the inbox
// settles whichever copy commits second as a duplicate.
func (s *Source) Fetch(ctx context.Context, maxN int, maxWait time.Duration) ([]source.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if maxN <= 0 {
		return nil, nil
	}
	if s.ahead != nil && s.aheadN > maxN {
		s.giveBackAhead() // asked for more than this call may return
	}
	wait := time.NewTimer(max(maxWait, time.Millisecond))
	defer wait.Stop()
	for {
		if s.late != nil {
			// Delivered before what the request ahead delivers.
			if msgs, err := s.takeLate(maxN); err != nil || len(msgs) > 0 {
				return msgs, err
			}
		}
		msgs, timedOut, err := s.takeAhead(ctx, maxN, wait.C, maxWait)
		if err != nil || len(msgs) > 0 {
			return msgs, err
		}
		if timedOut || maxWait <= 0 {
			return nil, nil
		}
		if s.ahead != nil {
			continue // a request still open: wait for its first message
		}
		// Caught up: wait (long poll).
		msgs, done, err := s.longPoll(ctx, maxN, maxWait)
		if done {
			return msgs, err
		}
	}
}

// takeAhead takes what the request ahead delivers, sending it first if
// there is none, and sends the next one when it returns messages. timedOut
// says wait fired before any message.
func (s *Source) takeAhead(ctx context.Context, maxN int, wait <-chan time.Time, maxWait time.Duration) (msgs []source.Message, timedOut bool, err error) {
	if s.ahead == nil {
		batch, err := s.consumer.FetchNoWait(maxN)
		if err != nil {
			return nil, false, fmt.Errorf("while fetching from JetStream: %w", err)
		}
		s.setAhead(batch, maxN, false, time.Time{})
	}
	var ended bool
	if s.aheadOpen || !s.fixed {
		// Adaptive: what the request has delivered and what the server
		// says is pending behind it, not what arrives later. (A no-wait
		// request for which messages were pending when it arrived stays
		// open on the server and keeps taking new ones until its batch is
		// full: at 10% load collecting it to its end held a fetch for up
		// to 0.9 s.)
		msgs, ended, timedOut, err = s.take(ctx, maxN, wait, maxWait)
		if !ended {
			s.aheadOpen = true
		}
	} else {
		msgs, ended, err = s.collect(ctx, maxN)
	}
	if err != nil || ended {
		s.ahead = nil
	}
	if err != nil || len(msgs) == 0 {
		return nil, timedOut, err
	}
	if !s.fixed && s.ahead == nil && len(msgs) < maxN && s.lastPending == 0 {
		if msgs, err = s.topUp(ctx, msgs, maxN); err != nil {
			return nil, false, err
		}
	}
	if s.ahead == nil {
		s.requestAhead(maxN)
	}
	return msgs, false, nil
}

// longPoll sends a waiting pull request once the consumer is caught up.
// With batching Fixed it collects the whole batch (or what came within
// maxWait) and done says Fetch returns it; with Adaptive the request
// becomes the open request ahead and Fetch waits for its first message.
func (s *Source) longPoll(ctx context.Context, maxN int, maxWait time.Duration) (msgs []source.Message, done bool, err error) {
	until := time.Now().Add(maxWait + expiryGrace)
	batch, err := s.consumer.Fetch(maxN, jetstream.FetchMaxWait(maxWait))
	if err != nil {
		return nil, true, fmt.Errorf("while fetching from JetStream: %w", err)
	}
	if !s.fixed {
		s.setAhead(batch, maxN, true, until)
		return nil, false, nil
	}
	s.setAhead(batch, maxN, false, until)
	msgs, err = s.collectAll(ctx, batch, maxN, until)
	s.ahead = nil
	if err == nil && len(msgs) > 0 {
		s.requestAhead(maxN)
	}
	return msgs, true, err
}

// topUp adds to a part batch what is available now. The request ahead
// holds what was there when it was sent, as the previous Fetch returned;
// while the caller committed, more may have arrived: with batching
// Adaptive those join this batch (one more no-wait request) instead of
// waiting for the next one, so a busy pipeline commits what accumulated
// in one transaction, as a group commit does.
func (s *Source) topUp(ctx context.Context, msgs []source.Message, maxN int) ([]source.Message, error) {
	batch, err := s.consumer.FetchNoWait(maxN - len(msgs))
	if err != nil {
		return msgs, nil // the next Fetch sends its own request and reports it
	}
	s.setAhead(batch, maxN-len(msgs), false, time.Time{})
	quiet := time.NewTimer(noWaitStall)
	defer quiet.Stop()
	more, ended, _, err := s.take(ctx, maxN-len(msgs), quiet.C, noWaitStall)
	if !ended {
		s.aheadOpen = true // the next Fetch takes what it still delivers
	}
	if err != nil {
		// The part batch in hand is good; what the top-up delivered is
		// redelivered after AckWait.
		s.ahead = nil
		s.log.Error(err, "JetStream top-up request failed after a part batch", "messages", len(msgs))
		return msgs, nil
	}
	if ended {
		s.ahead = nil
	}
	return append(msgs, more...), nil
}

// requestAhead sends the no-wait pull request of the next Fetch. An error
// here is not this fetch's: the next Fetch sends its own request and
// reports it.
func (s *Source) requestAhead(maxN int) {
	batch, err := s.consumer.FetchNoWait(maxN)
	if err != nil {
		s.ahead = nil
		return
	}
	s.setAhead(batch, maxN, false, time.Time{})
}

// setAhead makes batch, a pull request of n messages, the request ahead.
// until is when a waiting request has expired for sure (zero for a no-wait
// one).
func (s *Source) setAhead(batch jetstream.MessageBatch, n int, open bool, until time.Time) {
	s.ahead, s.aheadN, s.aheadOpen, s.aheadTaken, s.aheadUntil = batch, n, open, 0, until
}

// expiryGrace is how long after a waiting request's expiry (its maxWait
// from when it was sent) the adapter stops waiting for it. The server ends
// an expired request with a "408 Request Timeout" status, and nats.go then
// ends its batch; but a server without nats-server#3942 (merged March 2023,
// after 2.9.15; Debian's 2.9.10, the benchmark's, lacks it) that finds the
// request expired while it hands out a new message drops it without the
// status, and nats.go ends the batch only a second after its last message.
// Measured at 10% load with two replicas (issue 24): 12 long polls in 12 s
// ended so, 1.2 s after they were sent, and while both replicas waited on
// dead requests the consumer had no pull request on the server and every
// message published waited (the one-second stalls that set the p99). The
// grace covers the request's way to the server and the last message's way
// back; a request that delivers later still (a loaded server) is kept as
// the late request, and what it delivers is not lost.
const expiryGrace = 20 * time.Millisecond

// retire gives up on a waiting request past its expiry: it becomes the
// late request, whose messages the next Fetch takes, if it delivers any
// (the server was late, not silent). A late request still open from
// before gives back (NAK) what it delivered and still delivers, so that is
// redelivered at once instead of after AckWait; nats.go ends its batch
// maxWait + 1 s after its last message, which ends that goroutine. Against
// a server that drops expired requests silently (nats-server 2.9) an idle
// replica gives up a long poll every cycle, so a few such goroutines
// (about 1.2 s / maxWait) stay parked per idle replica: bounded, and each
// holds nothing but the dead batch.
func (s *Source) retire(batch jetstream.MessageBatch) {
	if prev := s.late; prev != nil {
		go func() {
			for m := range prev.Messages() {
				_ = m.Nak()
			}
		}()
	}
	s.late = batch
}

// takeLate takes, without waiting, what the late request has delivered,
// up to maxN, and drops it once it ended. When it returns messages there is
// a request ahead for the next Fetch.
func (s *Source) takeLate(maxN int) ([]source.Message, error) {
	var msgs []source.Message
	for len(msgs) < maxN {
		m, ok := ready(s.late)
		if !ok {
			s.late = nil
			break
		}
		if m == nil {
			break
		}
		msg, err := convert(m)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, msg)
	}
	if len(msgs) > 0 && s.ahead == nil {
		s.requestAhead(maxN)
	}
	return msgs, nil
}

// expiry fires when the request ahead is past aheadUntil (never for a
// no-wait request). Call stop when done.
func (s *Source) expiry() (expired <-chan time.Time, stop func() bool) {
	if s.aheadUntil.IsZero() {
		return nil, func() bool { return false }
	}
	t := time.NewTimer(time.Until(s.aheadUntil))
	return t.C, t.Stop
}

// firstWait is how the wait for a batch's first message ended.
type firstWait int

const (
	firstArrived   firstWait = iota // a message, or the batch ended
	firstTimedOut                   // the caller's wait fired
	firstExpired                    // the waiting request expired and was given up
	firstCancelled                  // ctx ended
)

// first waits for batch's first message, at most until wait fires or the
// request is past its expiry (expired).
func (s *Source) first(ctx context.Context, batch jetstream.MessageBatch, wait, expired <-chan time.Time) (jetstream.Msg, bool, firstWait) {
	select {
	case <-ctx.Done():
		return nil, false, firstCancelled
	case <-wait:
		return nil, false, firstTimedOut
	case m, ok := <-batch.Messages():
		return m, ok, firstArrived
	case <-expired:
		if m, ok := ready(batch); m != nil || !ok {
			return m, ok, firstArrived
		}
		s.retire(batch)
		return nil, false, firstExpired
	}
}

// ready is batch's next message if one has arrived: (nil, true) when none
// has, ok false when the batch ended.
func ready(batch jetstream.MessageBatch) (jetstream.Msg, bool) {
	select {
	case m, ok := <-batch.Messages():
		return m, ok
	default:
		return nil, true
	}
}

// fillGap bounds the wait for the next message of a burst the server said
// is pending (a backlog): a batch fills from it, but a message another
// replica's request took is not waited for longer than this.
const fillGap = 20 * time.Millisecond

// take waits (until wait fires) for batch's first message, then takes the
// messages batch has delivered, up to maxN, and, while the last one says
// more are pending on the server, waits up to fillGap for each next one.
// ended says the request is complete (every message it will deliver was
// taken); timedOut that wait fired before any message.
func (s *Source) take(ctx context.Context, maxN int, wait <-chan time.Time, fillFor time.Duration) (msgs []source.Message, ended, timedOut bool, err error) {
	batch := s.ahead
	var f filling
	defer f.stop()
	expired, stopExpiry := s.expiry()
	defer stopExpiry()
	for len(msgs) < maxN {
		if s.aheadTaken >= s.aheadN {
			// Every message the request asked for was taken: it is
			// complete (nats.go closes it right after the last).
			return msgs, true, false, nil
		}
		var m jetstream.Msg
		var ok bool
		if len(msgs) == 0 {
			var w firstWait
			switch m, ok, w = s.first(ctx, batch, wait, expired); w {
			case firstCancelled:
				// Whatever was delivered is redelivered after AckWait.
				return nil, true, false, ctx.Err()
			case firstTimedOut:
				return nil, false, true, nil // the request stays open for the next Fetch
			case firstExpired:
				return nil, true, false, nil // given up: the next Fetch sends another
			case firstArrived:
			}
		} else {
			var stop bool
			if m, ok, stop = f.next(batch, len(msgs)); stop {
				return msgs, false, false, nil
			}
		}
		if !ok {
			msgs, err := s.finish(msgs, batch.Error())
			return msgs, true, false, err
		}
		msg, md, err := convertMeta(m)
		if err != nil {
			return nil, true, false, err
		}
		f.pending = md.NumPending
		s.lastPending = f.pending
		s.aheadTaken++
		if len(msgs) == 0 {
			// The first message says how many were waiting behind it;
			// they are waited for at most fillFor (maxWait stays the
			// bound of every wait).
			f.want = int(min(uint64(maxN), 1+f.pending))
			f.until = time.Now().Add(max(fillFor, fillGap))
			msgs = make([]source.Message, 0, maxN)
		}
		msgs = append(msgs, msg)
	}
	return msgs, s.aheadTaken >= s.aheadN, false, nil
}

// filling is take's state after a batch's first message: the backlog the
// last message reported, how many messages take wants, and until when it
// waits for them.
type filling struct {
	pending uint64
	want    int
	until   time.Time
	gap     *time.Timer
}

func (f *filling) stop() {
	if f.gap != nil {
		f.gap.Stop()
	}
}

// next returns the batch's next message (ok false: the batch ended). stop
// says take returns what it has: nothing has arrived and either the
// backlog there was when take began is taken, or filling has run past its
// bound, or no message came within fillGap. Later arrivals are not waited
// for (a steady stream would otherwise keep one take going until its
// batch is full).
func (f *filling) next(batch jetstream.MessageBatch, have int) (m jetstream.Msg, ok, stop bool) {
	select {
	case m, ok = <-batch.Messages():
		return m, ok, false
	default:
	}
	if f.pending == 0 || have >= f.want || !time.Now().Before(f.until) {
		return nil, false, true
	}
	if f.gap == nil {
		f.gap = time.NewTimer(fillGap)
	} else {
		f.gap.Reset(fillGap)
	}
	select {
	case m, ok = <-batch.Messages():
		return m, ok, false
	case <-f.gap.C:
		return nil, false, true
	}
}

// noWaitStall bounds how long collect waits on a no-wait request that has
// gone quiet. The server answers one at once unless another replica's
// waiting request takes the messages it was queued for; then it may stay
// unanswered, and nats.go ends it only after a second (measured: one-second
// stalls of the whole loop at 10% load with two replicas). Past this, the
// request is kept as an open one: the next Fetch takes what it still
// delivers, so nothing is stranded.
const noWaitStall = 50 * time.Millisecond

// collect takes the messages of the no-wait request ahead until it ends
// (ended), or until it has been quiet for noWaitStall (then it stays open).
func (s *Source) collect(ctx context.Context, maxN int) ([]source.Message, bool, error) {
	batch := s.ahead
	msgs := make([]source.Message, 0, maxN)
	quiet := time.NewTimer(noWaitStall)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			// Whatever was delivered is redelivered after AckWait.
			return nil, true, ctx.Err()
		case <-quiet.C:
			s.aheadOpen, s.aheadTaken = true, len(msgs)
			return msgs, false, nil
		case m, ok := <-batch.Messages():
			if !ok {
				msgs, err := s.finish(msgs, batch.Error())
				return msgs, true, err
			}
			msg, md, err := convertMeta(m)
			if err != nil {
				return nil, true, err
			}
			s.lastPending = md.NumPending
			msgs = append(msgs, msg)
			if !quiet.Stop() {
				<-quiet.C
			}
			quiet.Reset(noWaitStall)
		}
	}
}

// collectAll takes every message of the waiting request batch until it
// ends, or, past until (its expiry, see expiryGrace), what it has
// delivered.
func (s *Source) collectAll(ctx context.Context, batch jetstream.MessageBatch, maxN int, until time.Time) ([]source.Message, error) {
	msgs := make([]source.Message, 0, maxN)
	expiry := time.NewTimer(time.Until(until))
	defer expiry.Stop()
	expired := false
	for {
		var m jetstream.Msg
		var ok bool
		if expired {
			if m, ok = ready(batch); m == nil && ok {
				s.retire(batch)
				return msgs, nil
			}
		} else {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-expiry.C:
				expired = true
				continue
			case m, ok = <-batch.Messages():
			}
		}
		if !ok {
			return s.finish(msgs, batch.Error())
		}
		msg, err := convert(m)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, msg)
	}
}

// finish returns the batch; a pull error after some messages arrived is only
// logged, so those messages are processed rather than left to AckWait.
func (s *Source) finish(msgs []source.Message, err error) ([]source.Message, error) {
	if err == nil {
		return msgs, nil
	}
	if len(msgs) > 0 {
		s.log.Error(err, "JetStream pull request ended with an error after some messages", "messages", len(msgs))
		return msgs, nil
	}
	return nil, fmt.Errorf("while fetching from JetStream: %w", err)
}

func convert(m jetstream.Msg) (source.Message, error) {
	msg, _, err := convertMeta(m)
	return msg, err
}

func convertMeta(m jetstream.Msg) (source.Message, *jetstream.MsgMetadata, error) {
	md, err := m.Metadata()
	if err != nil {
		return source.Message{}, nil, fmt.Errorf("while reading JetStream message metadata: %w", err)
	}
	var headers map[string]string // nil (readable) when there are none
	if h := m.Headers(); len(h) > 0 {
		headers = make(map[string]string, len(h))
		for k, v := range h {
			if len(v) > 0 {
				headers[k] = v[0]
			}
		}
	}
	return source.Message{
		NativeID:    md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10),
		Headers:     headers,
		Body:        m.Data(),
		PublishedAt: md.Timestamp,
		Attempt:     int(md.NumDelivered),
		Ref:         m,
	}, md, nil
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

// Close gives back the batch requested ahead, flushes and closes the
// connection. Other unacknowledged messages (fetched, not committed) are
// redelivered by the server after the consumer's AckWait. A failed flush is
// returned: acknowledgements may have been lost with it, so the stop is not
// graceful.
func (s *Source) Close() error {
	s.giveBackLate()
	s.giveBackAhead()
	err := s.nc.FlushTimeout(flushTimeout)
	s.nc.Close()
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("while flushing the last acknowledgements before closing the NATS connection: %w", err)
	}
	return nil
}

// giveBackAhead NAKs the messages of the batch requested ahead (nobody asked
// for them yet), so the server redelivers them at once to another replica
// instead of after AckWait (30 s by default). A given-back message counts
// one delivery, as its redelivery after AckWait would. Batches fetched and
// not started when the loop stops still wait for AckWait. It waits at most
// aheadGiveBack for the batch to arrive.
func (s *Source) giveBackAhead() {
	if s.ahead == nil {
		return
	}
	batch := s.ahead
	open := s.aheadOpen
	s.ahead, s.aheadOpen = nil, false
	deadline := time.NewTimer(aheadGiveBack)
	defer deadline.Stop()
	naked := 0
	for open {
		// A waiting request may stay open up to maxWait with nothing to
		// deliver: give back what it delivered, without waiting for it
		// to end (a message still on its way is redelivered after
		// AckWait).
		select {
		case m, ok := <-batch.Messages():
			if !ok {
				return
			}
			if err := m.Nak(); err == nil {
				naked++
			}
		default:
			if naked > 0 {
				s.log.Info("gave back the messages of the open request", "messages", naked)
			}
			return
		}
	}
	for {
		select {
		case m, ok := <-batch.Messages():
			if !ok {
				if naked > 0 {
					s.log.Info("gave back the batch requested ahead", "messages", naked)
				}
				return
			}
			if err := m.Nak(); err == nil {
				naked++
			}
		case <-deadline.C:
			return // the rest is redelivered after AckWait
		}
	}
}

// giveBackLate NAKs what the late request has delivered, without waiting
// for more (what it still delivers is redelivered after AckWait).
func (s *Source) giveBackLate() {
	if s.late == nil {
		return
	}
	naked := 0
	for m, ok := ready(s.late); ok && m != nil; m, ok = ready(s.late) {
		if m.Nak() == nil {
			naked++
		}
	}
	s.late = nil
	if naked > 0 {
		s.log.Info("gave back the messages of a pull request given up after its expiry", "messages", naked)
	}
}

// aheadGiveBack bounds how long Close waits for the batch requested ahead.
const aheadGiveBack = time.Second
