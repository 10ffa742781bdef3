package retention

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// lag sums end offset minus committed offset over every partition of the
// topics; a partition the group never committed counts from its log start
// offset, where the runtime's consumer starts (ConsumeResetOffset AtStart).
func (k *kafkaInspector) lag(ctx context.Context) (int64, error) {
	opts, err := k.options()
	if err != nil {
		return 0, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, fmt.Errorf("while creating the Kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics := strings.Join(k.cfg.Topics, ",")
	ends, err := adm.ListEndOffsets(ctx, k.cfg.Topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, kafkaRequestError("listing the end offsets of topics "+topics, err)
	}
	starts, err := adm.ListStartOffsets(ctx, k.cfg.Topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return 0, kafkaRequestError("listing the start offsets of topics "+topics, err)
	}
	committed, err := adm.FetchOffsets(ctx, k.cfg.ConsumerGroup)
	if errors.Is(err, kerr.GroupIDNotFound) {
		// No consumer joined yet: everything retained is backlog.
		committed, err = kadm.OffsetResponses{}, nil
	}
	if err != nil {
		return 0, kafkaRequestError("fetching the offsets of consumer group "+k.cfg.ConsumerGroup, err)
	}
	return kafkaLag(ends, starts, committed), nil
}

// kafkaLag is Σ end − max(committed, start) over the listed partitions.
func kafkaLag(ends, starts kadm.ListedOffsets, committed kadm.OffsetResponses) int64 {
	var total int64
	ends.Each(func(end kadm.ListedOffset) {
		from := int64(0)
		if s, ok := starts.Lookup(end.Topic, end.Partition); ok {
			from = s.Offset
		}
		if c, ok := committed.Lookup(end.Topic, end.Partition); ok && c.Err == nil && c.At > from {
			from = c.At
		}
		if end.Offset > from {
			total += end.Offset - from
		}
	})
	return total
}
