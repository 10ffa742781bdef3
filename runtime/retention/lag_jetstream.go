package retention

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// lag is the durable consumer's num_pending (not yet delivered) plus
// num_ack_pending (delivered, not yet acknowledged).
func (j *jetStreamSession) lag(ctx context.Context) (int64, error) {
	info, err := j.consumerInfo(ctx)
	if err != nil {
		return 0, err
	}
	return int64(info.NumPending) + int64(info.NumAckPending), nil
}

// consumerInfo reads the durable consumer's info; a consumer (or stream)
// that does not exist is ErrSourceNotFound.
func (j *jetStreamSession) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	c, err := j.js.Consumer(ctx, j.cfg.Stream, j.cfg.Consumer)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("%w: JetStream consumer %s on stream %s: %w", ErrSourceNotFound, j.cfg.Consumer, j.cfg.Stream, err)
	case jsUnreachable(err):
		return nil, unreachable("reading JetStream consumer "+j.cfg.Consumer, err)
	case err != nil:
		return nil, fmt.Errorf("while reading JetStream consumer %s on stream %s: %w", j.cfg.Consumer, j.cfg.Stream, err)
	}
	return c.CachedInfo(), nil
}
