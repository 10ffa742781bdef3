package retention

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

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

// NewInspector returns the Inspector for the source the config names.
// getenv nil means os.Getenv.
func NewInspector(cfg *config.Config, getenv Getenv) (Inspector, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	s := cfg.Source
	switch {
	case s.NATSJetStream != nil:
		return &jetStreamInspector{cfg: s.NATSJetStream, getenv: getenv}, nil
	case s.Kafka != nil:
		return &kafkaInspector{cfg: s.Kafka, getenv: getenv, outage: cfg.Retention.MaxConsumerOutage.Duration}, nil
	case s.RabbitMQ != nil:
		return &rabbitInspector{cfg: s.RabbitMQ, getenv: getenv, consumerTimeout: cfg.Retention.ConsumerTimeout.Duration}, nil
	case s.RedisStreams != nil:
		return &redisInspector{cfg: s.RedisStreams, getenv: getenv}, nil
	}
	return nil, errors.New("no source is configured: exactly one of natsJetStream, kafka, rabbitmq, redisStreams must be set")
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
	spec := SpecFrom(cfg.Retention)
	if err := spec.validate(); err != nil {
		return Result{}, err
	}
	if spec.Mode == ModeExplicit {
		return Compute(spec, Observation{}, now)
	}
	insp, err := NewInspector(cfg, getenv)
	if err != nil {
		return Result{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	obs, err := insp.Inspect(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("while reading retention settings from %s: %w", cfg.Source.Kind(), err)
	}
	return Compute(spec, obs, now)
}

// unreachable wraps cause as ErrBrokerUnreachable.
func unreachable(what string, cause error) error {
	return fmt.Errorf("%w: while %s: %w", ErrBrokerUnreachable, what, cause)
}

// redactURL drops the password from a URL for messages; a value that does
// not parse is not echoed at all.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}
