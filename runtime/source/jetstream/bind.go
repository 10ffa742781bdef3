package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// bindConsumer looks the durable consumer up and creates it only when it
// does not exist, so settings made by the user are never overwritten.
func bindConsumer(ctx context.Context, js jetstream.JetStream, cfg *config.JetStream, log logr.Logger, o options) (jetstream.Consumer, error) {
	if cfg.Partitioned() {
		part, err := partitionView(ctx, js, cfg)
		if err != nil {
			return nil, err
		}
		cfg = part
		log = log.WithValues("partition", cfg.PartitionIndex, "partitions", cfg.Partitions)
	}
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
	if cfg.OnePartition && (c.FilterSubject != cfg.FilterSubject || len(c.FilterSubjects) > 0) {
		// Reading another partition's subjects (or more) would break
		// the partitioning: refused, not used.
		return fmt.Errorf("JetStream consumer %s on stream %s is filtered to %s, but partition %d of %d reads %s (derived from the stream's subject transform): delete the consumer (nats consumer rm %s %s) and the runtime re-creates it with that filter",
			cfg.Consumer, cfg.Stream, filterOf(c), cfg.PartitionIndex, cfg.Partitions, cfg.FilterSubject, cfg.Stream, cfg.Consumer)
	}
	if cfg.FilterSubject != "" && c.FilterSubject != cfg.FilterSubject {
		log.Info("existing JetStream consumer has a different filter subject; using it unchanged",
			"configured", cfg.FilterSubject, "existing", c.FilterSubject, "existingFilters", c.FilterSubjects)
	}
	return nil
}

func filterOf(c jetstream.ConsumerConfig) string {
	switch {
	case len(c.FilterSubjects) > 0:
		return strings.Join(c.FilterSubjects, ",")
	case c.FilterSubject == "":
		return "the whole stream (no filter)"
	}
	return c.FilterSubject
}

// partitionView is the partition of a partitioned config this replica
// reads (ForPartition, which the runtime applies from --partition), with
// its FilterSubject derived from the stream's partitioning subject
// transform (retention.PartitionFilter). A server older than 2.10, which
// has no subject transforms, is refused.
func partitionView(ctx context.Context, js jetstream.JetStream, cfg *config.JetStream) (*config.JetStream, error) {
	if !cfg.OnePartition {
		return nil, fmt.Errorf("JetStream stream %s is read in %d partitions: a replica reads one (idc-runtime run --partition=<0..%d>)", cfg.Stream, cfg.Partitions, cfg.Partitions-1)
	}
	if err := retention.PartitionsSupported(js.Conn().ConnectedServerVersion()); err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("while reading JetStream stream %s for its partitioning subject transform: %w", cfg.Stream, err)
	}
	filter, err := retention.PartitionFilter(st.CachedInfo().Config, cfg.Partitions, cfg.PartitionIndex)
	if err != nil {
		return nil, err
	}
	part := *cfg
	part.FilterSubject = filter
	return &part, nil
}
