package retention

import (
	"context"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

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
// consumer loop; Read reads the lag over the connection of the window.
// getenv nil means os.Getenv. Errors never carry credentials.
func Lag(ctx context.Context, cfg *config.Config, getenv Getenv) (int64, error) {
	return readOne(ctx, cfg, getenv, lagError(cfg), session.lag)
}
