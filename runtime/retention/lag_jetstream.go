package retention

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// PartitionLag is one partition's share of a partitioned JetStream
// consumer's lag (config.JetStream.Partitions).
type PartitionLag struct {
	Index int
	// Consumer is the partition's durable (config.PartitionConsumer).
	Consumer string
	// Lag is valid only when Err is nil.
	Lag int64
	// Err wraps ErrSourceNotFound while the durable does not exist yet (the
	// partition's runtime creates it at its first start).
	Err error
}

// lag is the durable consumer's num_pending (not yet delivered) plus
// num_ack_pending (delivered, not yet acknowledged); of a partitioned
// config, the sum over the partitions' durables (see partitionLags).
func (j *jetStreamSession) lag(ctx context.Context) (int64, error) {
	if j.wholePartitioned() {
		total, _, err := j.partitionLags(ctx)
		return total, err
	}
	info, err := j.consumerInfo(ctx, j.cfg.Consumer)
	if err != nil {
		return 0, err
	}
	return consumerLag(info), nil
}

func consumerLag(info *jetstream.ConsumerInfo) int64 {
	return int64(info.NumPending) + int64(info.NumAckPending)
}

// partitionLags checks that the stream is partitioned as configured
// (checkPartitioned) and reads every partition's durable: the total is the
// sum over those that exist. A durable that does not exist yet is its
// PartitionLag's Err and makes err wrap ErrSourceNotFound too (with the
// total of the others); an unreachable broker ends the reading.
func (j *jetStreamSession) partitionLags(ctx context.Context) (int64, []PartitionLag, error) {
	if err := j.checkPartitioned(ctx); err != nil {
		return 0, nil, err
	}
	var total int64
	var missing []error
	parts := make([]PartitionLag, 0, j.cfg.Partitions)
	for i, name := range j.cfg.PartitionConsumers() {
		p := PartitionLag{Index: i, Consumer: name}
		info, err := j.consumerInfo(ctx, name)
		switch {
		case errors.Is(err, ErrSourceNotFound):
			p.Err = err
			missing = append(missing, fmt.Errorf("partition %d: %w", i, err))
		case err != nil:
			return 0, nil, err
		default:
			p.Lag = consumerLag(info)
			total += p.Lag
		}
		parts = append(parts, p)
	}
	j.partitions = parts
	return total, parts, errors.Join(missing...)
}

// consumerInfo reads the durable consumer's info; a consumer (or stream)
// that does not exist is ErrSourceNotFound.
func (j *jetStreamSession) consumerInfo(ctx context.Context, name string) (*jetstream.ConsumerInfo, error) {
	c, err := j.js.Consumer(ctx, j.cfg.Stream, name)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("%w: JetStream consumer %s on stream %s: %w", ErrSourceNotFound, name, j.cfg.Stream, err)
	case jsUnreachable(err):
		return nil, unreachable("reading JetStream consumer "+name, err)
	case err != nil:
		return nil, fmt.Errorf("while reading JetStream consumer %s on stream %s: %w", name, j.cfg.Stream, err)
	}
	return c.CachedInfo(), nil
}

// lastPartitions is what the last lag reading of a partitioned config read
// per partition (nil otherwise).
func (j *jetStreamSession) lastPartitions() []PartitionLag { return j.partitions }
