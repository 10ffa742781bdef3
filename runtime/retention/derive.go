package retention

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// DefaultTimeout bounds one introspection when the caller's context has no
// deadline.
const DefaultTimeout = 15 * time.Second

// Inspector reads the retention-relevant settings of one source, live.
type Inspector interface {
	Inspect(ctx context.Context) (Observation, error)
}

// Getenv resolves the environment variable names the config holds
// (credentials, TLS material). The pod passes os.Getenv; the controller a
// lookup over the referenced Secrets' values.
type Getenv func(name string) string

// opener is implemented by every source kind: it opens one connection to
// the broker, over which every reading of a call runs.
type opener interface {
	open(ctx context.Context) (session, error)
}

// session is one open connection to the source's broker.
type session interface {
	// inspect reads the retention-relevant settings.
	inspect(ctx context.Context) (Observation, error)
	// lag reads the broker's backlog for the consumer (see Lag).
	lag(ctx context.Context) (int64, error)
	// settle reads what the broker could still hand back (see Settle).
	settle(ctx context.Context) (Settlement, error)
	close()
}

// newOpener returns the opener for the source the config names. getenv nil
// means os.Getenv; dial opens the connections (nil: each client library's
// own dialer).
func newOpener(cfg *config.Config, getenv Getenv, dial brokerconn.Dialer) (opener, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	s := cfg.Source
	switch {
	case s.NATSJetStream != nil:
		return &jetStreamInspector{cfg: s.NATSJetStream, getenv: getenv, dial: dial}, nil
	case s.Kafka != nil:
		return &kafkaInspector{cfg: s.Kafka, getenv: getenv, dial: dial, outage: cfg.Retention.MaxConsumerOutage.Duration}, nil
	case s.RabbitMQ != nil:
		return &rabbitInspector{cfg: s.RabbitMQ, getenv: getenv, dial: dial, consumerTimeout: cfg.Retention.ConsumerTimeout.Duration}, nil
	case s.RedisStreams != nil:
		return &redisInspector{cfg: s.RedisStreams, getenv: getenv, dial: dial}, nil
	}
	return nil, errors.New("no source is configured: exactly one of natsJetStream, kafka, rabbitmq, redisStreams must be set")
}

// NewInspector returns the Inspector for the source the config names.
// getenv nil means os.Getenv. Each Inspect opens and closes a connection.
func NewInspector(cfg *config.Config, getenv Getenv) (Inspector, error) {
	op, err := newOpener(cfg, getenv, nil)
	if err != nil {
		return nil, err
	}
	return inspector{op}, nil
}

type inspector struct{ opener }

func (i inspector) Inspect(ctx context.Context) (Observation, error) {
	s, err := i.open(ctx)
	if err != nil {
		return Observation{}, err
	}
	defer s.close()
	return s.inspect(ctx)
}

// withSession opens one session on the source cfg names (DefaultTimeout
// bounding ctx when it has no deadline), runs fn on it and closes it.
// Errors of newOpener are returned as they are; errors of open and fn go
// through wrap.
func withSession(ctx context.Context, cfg *config.Config, getenv Getenv, dial brokerconn.Dialer, wrap func(error) error, fn func(context.Context, session) error) error {
	op, err := newOpener(cfg, getenv, dial)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	s, err := op.open(ctx)
	if err != nil {
		return wrap(err)
	}
	defer s.close()
	if err := fn(ctx, s); err != nil {
		return wrap(err)
	}
	return nil
}

// readOne is withSession for one reading: Lag and Settle.
func readOne[T any](ctx context.Context, cfg *config.Config, getenv Getenv, wrap func(error) error, reading func(session, context.Context) (T, error)) (T, error) {
	var out T
	err := withSession(ctx, cfg, getenv, nil, wrap, func(ctx context.Context, s session) error {
		var err error
		out, err = reading(s, ctx)
		return err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return out, nil
}

// inspectError, lagError and settleError say which reading of which
// source kind failed, keeping the cause wrapped for errors.Is.
func inspectError(cfg *config.Config) func(error) error {
	return func(err error) error {
		return fmt.Errorf("while reading retention settings from %s: %w", cfg.Source.Kind(), err)
	}
}

func lagError(cfg *config.Config) func(error) error {
	return func(err error) error { return fmt.Errorf("while reading the lag from %s: %w", cfg.Source.Kind(), err) }
}

func settleError(cfg *config.Config) func(error) error {
	return func(err error) error {
		return fmt.Errorf("while reading the settlement from %s: %w", cfg.Source.Kind(), err)
	}
}

// Derive computes the window for cfg at now. In Derived mode it reads the
// broker live; in Explicit mode it does not contact the broker. getenv
// resolves the credential environment variable names (nil: os.Getenv).
//
// Errors: ErrBrokerUnreachable or ErrSourceNotFound (keep the last window),
// ErrUnboundedReplay (reason UnboundedReplay, suspend pruning; the Result
// then still carries the horizons and DerivedFrom), ErrInvalidSpec.
// Neither errors nor DerivedFrom ever contain credentials.
func Derive(ctx context.Context, cfg *config.Config, getenv func(string) string, now time.Time) (Result, error) {
	r, err := read(ctx, cfg, getenv, now, nil, false)
	return r.Result, err
}

// Reading is what one Read of the broker returned.
type Reading struct {
	// Result is Derive's: the window, its inputs and, in Derived mode, the
	// consumer's broker-side limits.
	Result Result
	// Lag is Lag's reading, valid only when LagErr is nil.
	Lag int64
	// LagErr is nil exactly when Lag was read. It is the lag's own failure
	// when only that failed (e.g. ErrSourceNotFound for a JetStream
	// consumer that does not exist yet, whose window is still derived), or
	// Read's error when Read failed before the lag could be read.
	LagErr error
	// Partitions is, for a partitioned JetStream config
	// (config.JetStream.Partitions), each partition's lag, in partition
	// order: Lag is their sum, and LagErr wraps ErrSourceNotFound while a
	// partition's durable does not exist yet (its Err), Lag then summing
	// the others. Nil for other configs.
	Partitions []PartitionLag
}

// partitioned is a session whose lag reading spans partitions.
type partitioned interface {
	lastPartitions() []PartitionLag
}

func partitionsOf(s session) []PartitionLag {
	if p, ok := s.(partitioned); ok {
		return p.lastPartitions()
	}
	return nil
}

// Read derives the window and reads the lag over one connection: the
// broker is dialled once per call, where Derive followed by Lag dial twice.
//
// In Derived mode it is Derive and Lag in one, with Derive's errors
// (ErrBrokerUnreachable, ErrSourceNotFound, ErrInvalidSpec; with
// ErrUnboundedReplay the Result is still filled in and the lag still read);
// a failure of the lag alone is LagErr, not an error. In Explicit mode the
// window comes from the spec as in Derive and the connection is opened for
// the lag only: a broker that cannot be reached then is LagErr, never an
// error, so the window never depends on the broker. An invalid spec fails
// before any broker call. getenv nil means os.Getenv. Neither errors nor
// DerivedFrom ever contain credentials.
func Read(ctx context.Context, cfg *config.Config, getenv func(string) string, now time.Time) (Reading, error) {
	return read(ctx, cfg, getenv, now, nil, true)
}

// read is Derive (withLag false) and Read (withLag true); dial opens the
// broker connections (nil: the client libraries' dialers), so tests can
// count them.
func read(ctx context.Context, cfg *config.Config, getenv Getenv, now time.Time, dial brokerconn.Dialer, withLag bool) (Reading, error) {
	spec := SpecFrom(cfg.Retention)
	if err := spec.validate(); err != nil {
		return Reading{LagErr: err}, err
	}
	var out Reading
	if spec.Mode == ModeExplicit {
		res, err := Compute(spec, Observation{}, now)
		out.Result = res
		if withLag {
			out.LagErr = withSession(ctx, cfg, getenv, dial, lagError(cfg), func(ctx context.Context, s session) error {
				var lerr error
				out.Lag, lerr = s.lag(ctx)
				out.Partitions = partitionsOf(s)
				return lerr
			})
		}
		return out, err
	}
	var obs Observation
	err := withSession(ctx, cfg, getenv, dial, inspectError(cfg), func(ctx context.Context, s session) error {
		var err error
		if obs, err = s.inspect(ctx); err != nil {
			return err
		}
		if withLag {
			var lerr error
			if out.Lag, lerr = s.lag(ctx); lerr != nil {
				out.LagErr = lagError(cfg)(lerr)
			}
			out.Partitions = partitionsOf(s)
		}
		return nil
	})
	if err != nil {
		return Reading{LagErr: err}, err
	}
	out.Result, err = Compute(spec, obs, now)
	return out, err
}

// unreachable wraps cause as ErrBrokerUnreachable.
func unreachable(what string, cause error) error {
	return fmt.Errorf("%w: while %s: %w", ErrBrokerUnreachable, what, cause)
}
