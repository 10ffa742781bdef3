package retention

import (
	"context"
	"fmt"
)

// rabbitQueueSettlement is the part of GET /api/queues/{vhost}/{name} that
// settle reads.
type rabbitQueueSettlement struct {
	Ready    int64 `json:"messages_ready"`
	Unacked  int64 `json:"messages_unacknowledged"`
	Messages *struct {
		Ack *int64 `json:"ack"`
	} `json:"message_stats"`
}

// settle reads the queue from the management API: Unsettled is
// messages_ready + messages_unacknowledged, and key "acks" counts the
// acknowledgements the queue has had (message_stats.ack, 0 when absent).
// Floor is that count; Position is it plus every message the queue holds.
//
// Why a count of acknowledgements works as a position: a crashed consumer's
// unacknowledged deliveries are requeued at the head of the queue when its
// connection closes, so once as many further acknowledgements as the queue
// held have happened, they were delivered again and acknowledged. The
// management statistics lag the queue by the collection interval (5 s by
// default): a reading can be that much behind the broker.
func (r *rabbitSession) settle(ctx context.Context) (Settlement, error) {
	var q rabbitQueueSettlement
	if err := r.readQueue(ctx, &q); err != nil {
		return Settlement{}, err
	}
	acks := int64(0)
	if q.Messages != nil && q.Messages.Ack != nil {
		acks = *q.Messages.Ack
	}
	return Settlement{
		Unsettled: q.Ready + q.Unacked,
		Position:  map[string]int64{"acks": acks + q.Ready + q.Unacked},
		Floor:     map[string]int64{"acks": acks},
		Facts: fmt.Sprintf("RabbitMQ queue %q in vhost %q: acknowledged %d, ready %d, unacknowledged %d (management statistics)",
			r.cfg.Queue, r.vhost, acks, q.Ready, q.Unacked),
	}, nil
}
