package jetstream

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

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
