package retention

import "context"

// rabbitQueueDepth is the part of GET /api/queues/{vhost}/{name} that lag reads.
type rabbitQueueDepth struct {
	Ready   int64 `json:"messages_ready"`
	Unacked int64 `json:"messages_unacknowledged"`
}

// lag is the queue's messages_ready + messages_unacknowledged, from the
// management API (its statistics lag the queue by the broker's collection
// interval, 5 s by default).
func (r *rabbitSession) lag(ctx context.Context) (int64, error) {
	var q rabbitQueueDepth
	if err := r.readQueue(ctx, &q); err != nil {
		return 0, err
	}
	return q.Ready + q.Unacked, nil
}
