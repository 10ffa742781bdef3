package retention

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// settle reads the durable consumer's info: num_ack_pending messages were
// delivered and not acknowledged, and come back after ack_wait; every
// stream sequence at or below the ack floor is acknowledged. With nothing
// pending, everything delivered is settled, so the floor is the delivered
// sequence (the ack floor can trail it, e.g. when acknowledged messages
// were removed from the stream).
func (j *jetStreamInspector) settle(ctx context.Context) (Settlement, error) {
	opts, err := j.options()
	if err != nil {
		return Settlement{}, err
	}
	nc, err := nats.Connect(j.cfg.URL, opts...)
	if err != nil {
		return Settlement{}, unreachable("connecting to NATS at "+redactURL(j.cfg.URL), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return Settlement{}, fmt.Errorf("while opening the JetStream context: %w", err)
	}
	c, err := js.Consumer(ctx, j.cfg.Stream, j.cfg.Consumer)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return Settlement{}, fmt.Errorf("%w: JetStream consumer %s on stream %s: %w", ErrSourceNotFound, j.cfg.Consumer, j.cfg.Stream, err)
	case jsUnreachable(err):
		return Settlement{}, unreachable("reading JetStream consumer "+j.cfg.Consumer, err)
	case err != nil:
		return Settlement{}, fmt.Errorf("while reading JetStream consumer %s on stream %s: %w", j.cfg.Consumer, j.cfg.Stream, err)
	}
	return jetStreamSettlement(j.cfg.Consumer, j.cfg.Stream, c.CachedInfo()), nil
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
