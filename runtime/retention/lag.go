package retention

import (
	"context"
	"fmt"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// lagReader is implemented by every Inspector: the broker's own backlog
// for this consumer, read live.
type lagReader interface {
	lag(ctx context.Context) (int64, error)
}

// Lag returns the broker's backlog for the consumer cfg names, in messages:
//
//   - JetStream: the durable consumer's num_pending + num_ack_pending;
//   - Kafka: the sum over the topics' partitions of the end offset minus the
//     group's committed offset (the log start offset where it has none);
//   - RabbitMQ: the queue's messages_ready + messages_unacknowledged
//     (management API, refreshed by the broker every few seconds);
//   - Redis Streams: the group's lag from XINFO GROUPS (entries not yet
//     delivered to it).
//
// Each call opens and closes its own connection, so it is safe next to the
// consumer loop. getenv nil means os.Getenv. Errors never carry credentials.
func Lag(ctx context.Context, cfg *config.Config, getenv Getenv) (int64, error) {
	insp, err := NewInspector(cfg, getenv)
	if err != nil {
		return 0, err
	}
	lr, ok := insp.(lagReader)
	if !ok {
		return 0, fmt.Errorf("no lag reader for %s", cfg.Source.Kind())
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	n, err := lr.lag(ctx)
	if err != nil {
		return 0, fmt.Errorf("while reading the lag from %s: %w", cfg.Source.Kind(), err)
	}
	return n, nil
}
