package retention

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// settle reads the durable consumer's info: num_ack_pending messages were
// delivered and not acknowledged, and come back after ack_wait; every
// stream sequence at or below the ack floor is acknowledged. With nothing
// pending, everything delivered is settled, so the floor is the delivered
// sequence (the ack floor can trail it, e.g. when acknowledged messages
// were removed from the stream).
func (j *jetStreamSession) settle(ctx context.Context) (Settlement, error) {
	info, err := j.consumerInfo(ctx)
	if err != nil {
		return Settlement{}, err
	}
	return jetStreamSettlement(j.cfg.Consumer, j.cfg.Stream, info), nil
}

func jetStreamSettlement(consumer, stream string, info *jetstream.ConsumerInfo) Settlement {
	delivered, ackFloor := int64(info.Delivered.Stream), int64(info.AckFloor.Stream)
	floor := ackFloor
	if info.NumAckPending == 0 {
		floor = max(ackFloor, delivered)
	}
	return Settlement{
		Unsettled: int64(info.NumAckPending),
		Position:  map[string]int64{"stream": delivered},
		Floor:     map[string]int64{"stream": floor},
		Facts: fmt.Sprintf("JetStream consumer %s on stream %s: ack floor %d, delivered %d, ack pending %d",
			consumer, stream, ackFloor, delivered, info.NumAckPending),
	}
}
