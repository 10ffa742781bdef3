package retention

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// settle reads the durable consumer's info: num_ack_pending messages were
// delivered and not acknowledged, and come back after ack_wait; every
// stream sequence at or below the ack floor is acknowledged. With nothing
// pending, everything delivered is settled, so the floor is the delivered
// sequence (the ack floor can trail it, e.g. when acknowledged messages
// were removed from the stream). It also reads the stream's state: the
// last sequence is the Ceiling, and on a workqueue or interest stream a
// message still stored is not settled for good whatever the consumer says
// (a re-created durable reports nothing pending while the stream holds
// every message the gone one never acknowledged).
func (j *jetStreamSession) settle(ctx context.Context) (Settlement, error) {
	if j.wholePartitioned() {
		return Settlement{}, fmt.Errorf("JetStream stream %s is read in %d partitions, each by its own durable: a settlement is read of one partition's (config.JetStream.ForPartition)", j.cfg.Stream, j.cfg.Partitions)
	}
	info, err := j.consumerInfo(ctx, j.cfg.Consumer)
	if err != nil {
		return Settlement{}, err
	}
	st, err := j.js.Stream(ctx, j.cfg.Stream)
	if err != nil {
		return Settlement{}, fmt.Errorf("while reading the state of JetStream stream %s: %w", j.cfg.Stream, err)
	}
	s := jetStreamSettlement(j.cfg.Consumer, j.cfg.Stream, info, st.CachedInfo())
	created := info.Created
	s.Consumer.Created = &created // Settle names it
	return s, nil
}

func jetStreamSettlement(consumer, stream string, info *jetstream.ConsumerInfo, si *jetstream.StreamInfo) Settlement {
	delivered, ackFloor := int64(info.Delivered.Stream), int64(info.AckFloor.Stream)
	floor := ackFloor
	if info.NumAckPending == 0 {
		floor = max(ackFloor, delivered)
	}
	unsettled := int64(info.NumAckPending)
	ceiling := delivered
	facts := fmt.Sprintf("JetStream consumer %s (created %s) on stream %s: ack floor %d, delivered %d, ack pending %d",
		consumer, info.Created.UTC().Format(time.RFC3339), stream, ackFloor, delivered, info.NumAckPending)
	if si != nil {
		state := si.State
		ceiling = max(ceiling, int64(state.LastSeq))
		removesAcked := si.Config.Retention == jetstream.WorkQueuePolicy || si.Config.Retention == jetstream.InterestPolicy
		if removesAcked && state.Msgs > 0 {
			// Every message below the first stored one is gone; the
			// stored ones are outstanding.
			floor = min(floor, int64(state.FirstSeq)-1)
			if int64(state.FirstSeq) <= delivered {
				unsettled = max(unsettled, min(int64(state.Msgs), delivered-int64(state.FirstSeq)+1))
			}
		}
		facts += fmt.Sprintf("; stream %s retention %s: %d messages stored, sequences %d-%d",
			stream, retentionName(si.Config.Retention), state.Msgs, state.FirstSeq, state.LastSeq)
	}
	return Settlement{
		Unsettled: unsettled,
		Position:  map[string]int64{"stream": delivered},
		Floor:     map[string]int64{"stream": floor},
		Ceiling:   map[string]int64{"stream": ceiling},
		Monotonic: []string{"stream"},
		Facts:     facts,
	}
}
