package retention

import (
	"context"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// Settlement is what the broker could still hand back to the consumer, read live.
type Settlement struct {
	// Unsettled counts messages the broker could still deliver again, or that were delivered and never acknowledged; 0 means nothing the consumer was handed can come back.
	Unsettled int64
	// Position says how far delivery has got now, per key: every message the broker has handed out so far lies at or below Position[key].
	Position map[string]int64
	// Floor says how far settlement has got, per key: every message at or below Floor[key] is acknowledged (or gone) for good.
	Floor map[string]int64
	// Facts describes the reading in one line for logs and status, e.g. "JetStream consumer c on stream S: ack floor 0, delivered 200, ack pending 200". Never credentials.
	Facts string
	// Consumer is the consumer read (IdentityOf; JetStream with its
	// creation time). A gone replica's record is retired on this reading
	// only when it names the consumer the replica consumed from.
	Consumer inbox.ConsumerIdentity
	// Ceiling says, per key of Position, how far the broker has stored
	// messages: a consumer other than the replica's may still hand out
	// anything up to it (JetStream: the stream's last sequence). Nil means
	// Position.
	Ceiling map[string]int64
	// Monotonic lists the keys whose Position never goes back for one
	// consumer (a delivered sequence, a last-delivered-id, an end offset,
	// an acknowledgement count): one that did was reset or re-created.
	Monotonic []string
	// Unknown, when set, says why this reading proves nothing (a counter
	// the broker did not report).
	Unknown string
}

// Passed reports whether everything up to mark has settled: nothing is unsettled, or Floor[k] >= mark[k] for every key of mark (a key missing from Floor has not passed).
func (s Settlement) Passed(mark map[string]int64) bool {
	if s.Unsettled == 0 {
		return true
	}
	for k, m := range mark {
		f, ok := s.Floor[k]
		if !ok || f < m {
			return false
		}
	}
	return true
}

// Settle reads the broker's settlement for the consumer cfg names; like Lag it opens and closes its own connection, applies DefaultTimeout when ctx has no deadline, and wraps errors as "while reading the settlement from <kind>: %w" keeping ErrBrokerUnreachable / ErrSourceNotFound wrapped so callers can errors.Is them. getenv nil means os.Getenv.
//
//   - JetStream: Unsettled is the durable consumer's num_ack_pending,
//     Position and Floor (key "stream") its delivered and ack floor stream
//     sequences; with nothing pending the floor is the delivered sequence;
//   - Kafka: per "<topic>/<partition>", Position is the end offset and Floor
//     the group's committed offset (the log start offset where it has none,
//     or where the start has passed it); both are "next offset", and
//     Unsettled is Σ end − floor;
//   - RabbitMQ: Unsettled is messages_ready + messages_unacknowledged; key
//     "acks" counts the queue's acknowledgements (management statistics);
//   - Redis Streams: Unsettled is the group's pending entries list; key
//     "stream" holds entry IDs encoded by redisIDCeil and redisIDFloor.
//
// A prune job stamps Position when a replica crashes and waits until
// Passed(stamp): then nothing that replica was handed can come back.
func Settle(ctx context.Context, cfg *config.Config, getenv Getenv) (Settlement, error) {
	st, err := readOne(ctx, cfg, getenv, settleError(cfg), session.settle)
	if err == nil {
		st.Consumer = IdentityOf(cfg.Source, st.Consumer.Created)
	}
	return st, err
}
