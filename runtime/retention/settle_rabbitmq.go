package retention

import (
	"context"
	"fmt"
)

// rabbitQueueSettlement is the part of GET /api/queues/{vhost}/{name} that
// settle reads. Pointers: a counter the API leaves out (or reports null,
// e.g. before the first statistics collection of a queue, or with
// statistics disabled) is unknown, never 0.
type rabbitQueueSettlement struct {
	Ready    *int64 `json:"messages_ready"`
	Unacked  *int64 `json:"messages_unacknowledged"`
	Messages *struct {
		Ack *int64 `json:"ack"`
	} `json:"message_stats"`
}

// rabbitAckCount is the key of the bare acknowledgement count in Position
// and Floor: the count only grows, so a mark's count above the reading's
// is a reset (a broker restart clears the management statistics, a
// re-created queue starts from none).
const rabbitAckCount = "ackCount"

// settle reads the queue from the management API: Unsettled is
// messages_ready + messages_unacknowledged, and key "acks" counts the
// acknowledgements the queue has had (message_stats.ack). Floor is that
// count; Position is it plus every message the queue holds. Key
// rabbitAckCount holds the bare count in both, so Passed fails after a
// counter reset.
//
// Why a count of acknowledgements works as a position: a crashed consumer's
// unacknowledged deliveries are requeued at the head of the queue when its
// connection closes, so once as many further acknowledgements as the queue
// held have happened, they were delivered again and acknowledged. The
// management statistics lag the queue by the collection interval (5 s by
// default): a reading can be that much behind the broker.
//
// A missing ready or unacknowledged count makes the reading Unknown. A
// missing ack count is 0 acknowledgements only while the queue holds
// nothing (no ack ever, nothing to settle); with messages in it, it is
// Unknown too.
func (r *rabbitSession) settle(ctx context.Context) (Settlement, error) {
	var q rabbitQueueSettlement
	if err := r.readQueue(ctx, &q); err != nil {
		return Settlement{}, err
	}
	return rabbitSettlement(r.cfg.Queue, r.vhost, q), nil
}

func rabbitSettlement(queue, vhost string, q rabbitQueueSettlement) Settlement {
	var unknown []string
	ready, unacked, acks := int64(0), int64(0), int64(0)
	if q.Ready == nil {
		unknown = append(unknown, "messages_ready")
	} else {
		ready = *q.Ready
	}
	if q.Unacked == nil {
		unknown = append(unknown, "messages_unacknowledged")
	} else {
		unacked = *q.Unacked
	}
	hasAcks := q.Messages != nil && q.Messages.Ack != nil
	if hasAcks {
		acks = *q.Messages.Ack
	} else if ready+unacked > 0 || len(unknown) > 0 {
		unknown = append(unknown, "message_stats.ack")
	}
	s := Settlement{
		Unsettled: ready + unacked,
		Position:  map[string]int64{"acks": acks + ready + unacked, rabbitAckCount: acks},
		Floor:     map[string]int64{"acks": acks, rabbitAckCount: acks},
		Monotonic: []string{rabbitAckCount},
		Facts: fmt.Sprintf("RabbitMQ queue %q in vhost %q: acknowledged %s, ready %s, unacknowledged %s (management statistics)",
			queue, vhost, orUnknown(q.Messages != nil && q.Messages.Ack != nil, acks), orUnknown(q.Ready != nil, ready), orUnknown(q.Unacked != nil, unacked)),
	}
	if len(unknown) > 0 {
		s.Unknown = fmt.Sprintf("the management API did not report %v for queue %q: unknown, not 0, so nothing is proven settled", unknown, queue)
	}
	return s
}

func orUnknown(known bool, n int64) string {
	if !known {
		return "unknown"
	}
	return fmt.Sprint(n)
}
