package retention

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// lag is the durable consumer's num_pending (not yet delivered) plus
// num_ack_pending (delivered, not yet acknowledged).
func (j *jetStreamInspector) lag(ctx context.Context) (int64, error) {
	opts, err := j.options()
	if err != nil {
		return 0, err
	}
	nc, err := nats.Connect(j.cfg.URL, opts...)
	if err != nil {
		return 0, unreachable("connecting to NATS at "+redactURL(j.cfg.URL), err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, fmt.Errorf("while opening the JetStream context: %w", err)
	}
	c, err := js.Consumer(ctx, j.cfg.Stream, j.cfg.Consumer)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return 0, fmt.Errorf("%w: JetStream consumer %s on stream %s: %w", ErrSourceNotFound, j.cfg.Consumer, j.cfg.Stream, err)
	case jsUnreachable(err):
		return 0, unreachable("reading JetStream consumer "+j.cfg.Consumer, err)
	case err != nil:
		return 0, fmt.Errorf("while reading JetStream consumer %s on stream %s: %w", j.cfg.Consumer, j.cfg.Stream, err)
	}
	info := c.CachedInfo()
	return int64(info.NumPending) + int64(info.NumAckPending), nil
}
