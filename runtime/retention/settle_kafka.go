package retention

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// kafkaFactsPartitions bounds how many partitions Facts spells out.
const kafkaFactsPartitions = 8

// settle reads, per partition of the topics, the end offset (Position: the
// next offset to be written, so every record handed out lies below it) and
// the group's committed offset (Floor: the next offset the group would
// fetch, so every record below it is settled). A partition the group never
// committed, or whose log start offset has passed the commit, floors at the
// start offset: the records below it are gone. Kafka does not track
// deliveries, so every record between the floor and the end is counted as
// Unsettled: a consumer restarting from the commit is handed it again.
func (k *kafkaSession) settle(ctx context.Context) (Settlement, error) {
	offs, err := k.groupOffsets(ctx, kafkaOffsetsError)
	if err != nil {
		return Settlement{}, err
	}
	s := kafkaSettlement(offs.ends, offs.starts, offs.committed)
	s.Facts = fmt.Sprintf("Kafka consumer group %s on topics %s: %s; unsettled %d", k.cfg.ConsumerGroup, strings.Join(k.cfg.Topics, ","), s.Facts, s.Unsettled)
	return s, nil
}

// kafkaOffsetsError: a topic the broker does not know is ErrSourceNotFound.
func kafkaOffsetsError(what string, err error) error {
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return fmt.Errorf("%w: while %s: %w", ErrSourceNotFound, what, err)
	}
	return kafkaRequestError(what, err)
}

// kafkaSettlement keys every listed partition "<topic>/<partition>":
// Position is the end offset, Floor max(committed, start), Unsettled
// Σ max(0, end − floor). Facts holds only the per-partition part.
func kafkaSettlement(ends, starts kadm.ListedOffsets, committed kadm.OffsetResponses) Settlement {
	// End offsets only grow while the topic exists: one that went back is
	// a re-created topic.
	s := Settlement{Position: map[string]int64{}, Floor: map[string]int64{}}
	type part struct {
		topic     string
		partition int32
		fact      string
	}
	var parts []part
	ends.Each(func(end kadm.ListedOffset) {
		floor, from := int64(0), "start"
		if st, ok := starts.Lookup(end.Topic, end.Partition); ok {
			floor = st.Offset
		}
		if c, ok := committed.Lookup(end.Topic, end.Partition); ok && c.Err == nil && c.At >= floor {
			floor, from = c.At, "committed"
		}
		key := end.Topic + "/" + strconv.Itoa(int(end.Partition))
		s.Position[key] = end.Offset
		s.Floor[key] = floor
		s.Monotonic = append(s.Monotonic, key)
		if end.Offset > floor {
			s.Unsettled += end.Offset - floor
		}
		parts = append(parts, part{end.Topic, end.Partition, fmt.Sprintf("%s %s %d end %d", key, from, floor, end.Offset)})
	})
	slices.SortFunc(parts, func(a, b part) int {
		if c := strings.Compare(a.topic, b.topic); c != 0 {
			return c
		}
		return int(a.partition - b.partition)
	})
	facts := make([]string, 0, kafkaFactsPartitions+1)
	for i, p := range parts {
		if i == kafkaFactsPartitions {
			facts = append(facts, fmt.Sprintf("and %d more partitions", len(parts)-i))
			break
		}
		facts = append(facts, p.fact)
	}
	if len(facts) == 0 {
		facts = append(facts, "no partitions")
	}
	s.Facts = strings.Join(facts, ", ")
	return s
}
