package retention

import (
	"context"
	"errors"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// lag sums end offset minus committed offset over every partition of the
// topics; a partition the group never committed counts from its log start
// offset, where the runtime's consumer starts (ConsumeResetOffset AtStart).
func (k *kafkaSession) lag(ctx context.Context) (int64, error) {
	offs, err := k.groupOffsets(ctx, kafkaRequestError)
	if err != nil {
		return 0, err
	}
	return kafkaLag(offs.ends, offs.starts, offs.committed), nil
}

// kafkaGroupOffsets are the topics' end and start offsets and the group's
// committed offsets, read together by lag and settle.
type kafkaGroupOffsets struct {
	ends, starts kadm.ListedOffsets
	committed    kadm.OffsetResponses
}

// groupOffsets reads kafkaGroupOffsets; listErr wraps a failure to list
// the topics' offsets. A group that does not exist yet has no committed
// offsets.
func (k *kafkaSession) groupOffsets(ctx context.Context, listErr func(what string, err error) error) (kafkaGroupOffsets, error) {
	var out kafkaGroupOffsets
	var err error
	topics := strings.Join(k.cfg.Topics, ",")
	if out.ends, err = k.adm.ListEndOffsets(ctx, k.cfg.Topics...); err == nil {
		err = out.ends.Error()
	}
	if err != nil {
		return out, listErr("listing the end offsets of topics "+topics, err)
	}
	if out.starts, err = k.adm.ListStartOffsets(ctx, k.cfg.Topics...); err == nil {
		err = out.starts.Error()
	}
	if err != nil {
		return out, listErr("listing the start offsets of topics "+topics, err)
	}
	out.committed, err = k.adm.FetchOffsets(ctx, k.cfg.ConsumerGroup)
	if errors.Is(err, kerr.GroupIDNotFound) {
		// No consumer joined yet: nothing is committed.
		out.committed, err = kadm.OffsetResponses{}, nil
	}
	if err != nil {
		return out, kafkaRequestError("fetching the offsets of consumer group "+k.cfg.ConsumerGroup, err)
	}
	return out, nil
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
