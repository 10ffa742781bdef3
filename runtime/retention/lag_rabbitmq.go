package retention

import (
	"context"
	"net/url"
)

// rabbitQueueDepth is the part of GET /api/queues/{vhost}/{name} that lag reads.
type rabbitQueueDepth struct {
	Ready   int64 `json:"messages_ready"`
	Unacked int64 `json:"messages_unacknowledged"`
}

// lag is the queue's messages_ready + messages_unacknowledged, from the
// management API (its statistics lag the queue by the broker's collection
// interval, 5 s by default).
func (r *rabbitInspector) lag(ctx context.Context) (int64, error) {
	uri, err := r.uri()
	if err != nil {
		return 0, err
	}
	api, err := r.api(uri)
	if err != nil {
		return 0, err
	}
	var q rabbitQueueDepth
	path := "/api/queues/" + url.PathEscape(uri.Vhost) + "/" + url.PathEscape(r.cfg.Queue)
	if err := api.get(ctx, path, &q); err != nil {
		return 0, rabbitQueueError(err, r.cfg.Queue, uri.Vhost)
	}
	return q.Ready + q.Unacked, nil
}
