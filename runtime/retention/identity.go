package retention

import (
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// IdentityOf names the broker consumer src reads: what a replica records
// in its progress row and what a prune run compares the consumer it reads
// with. created is the broker's creation time of the consumer where it
// records one (JetStream), else nil.
func IdentityOf(src config.Source, created *time.Time) inbox.ConsumerIdentity {
	id := inbox.ConsumerIdentity{Kind: src.Kind(), Created: created}
	switch {
	case src.NATSJetStream != nil:
		id.Name = src.NATSJetStream.Stream + "/" + src.NATSJetStream.Consumer
	case src.Kafka != nil:
		id.Name = src.Kafka.ConsumerGroup
	case src.RabbitMQ != nil:
		id.Name = src.RabbitMQ.Queue
	case src.RedisStreams != nil:
		id.Name = src.RedisStreams.Stream + "/" + src.RedisStreams.Group
	}
	return id
}

// RedisPosition is a Redis entry ID as a progress position (key "stream"),
// encoded as the settlement encodes the group's last-delivered-id
// (redisIDCeil), so a prune run can tell a group whose delivery went back
// below what a replica claimed (re-created, or set back with XGROUP SETID).
func RedisPosition(id string) (int64, bool) {
	n, err := redisIDFloor(id)
	return n, err == nil
}
