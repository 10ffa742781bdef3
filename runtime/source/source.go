// Package source defines the one small interface every broker adapter
// satisfies. The consumer loop fetches a batch, commits its effects to
// PostgreSQL, and only then acknowledges the batch through the same Source.
package source

import (
	"context"
	"time"
)

// Message is one delivery from a broker.
type Message struct {
	// NativeID is the broker's own identity for the stored record, stable
	// across redeliveries of that record (JetStream "<stream>:<stream seq>",
	// Kafka "<topic>/<partition>/<offset>", RabbitMQ the message_id property,
	// Redis the entry id). A producer that re-publishes gets a new NativeID,
	// which is why `message.id.brokerNative` is documented as a pitfall.
	NativeID string
	// Headers holds the first value of each header (AMQP properties and
	// headers, Kafka record headers, NATS headers, Redis entry fields other
	// than the body field).
	Headers map[string]string
	// Body is the payload.
	Body []byte
	// PublishedAt is the broker's stored publish/append time of the record,
	// stable across redeliveries and replays (the partition key of the
	// Partitioned inbox layout).
	PublishedAt time.Time
	// Attempt is the broker's delivery count when it reports one (1 = first
	// delivery), otherwise 0.
	Attempt int
	// Ref is adapter-private data needed to acknowledge the message.
	Ref any
}

// Source is a broker adapter.
//
// Fetch is called by one goroutine at a time; Ack may be called from other
// goroutines at the same time as Fetch and as other Acks (the consumer loop
// fetches the next batch while in-flight transactions commit and each lane
// acknowledges its own messages). Implementations reconnect on their own:
// after an error from Fetch or Ack the loop backs off and calls again.
type Source interface {
	// Fetch returns up to max messages, waiting at most maxWait for the first
	// one. An empty slice with a nil error means nothing arrived in time.
	Fetch(ctx context.Context, max int, maxWait time.Duration) ([]Message, error)
	// Ack acknowledges messages returned by Fetch. It is called only after the
	// database transaction holding their effects has committed, for every
	// message of that transaction (duplicates and dead letters included).
	// Messages of one Fetch may be acknowledged in several calls and out of
	// fetch order; an adapter whose broker acknowledges cumulatively (Kafka
	// offsets) must not acknowledge past a message still outstanding.
	Ack(ctx context.Context, msgs []Message) error
	// Close releases connections. Unacknowledged messages are redelivered by
	// the broker later.
	Close() error
}

// Confirmer is implemented by a Source whose Ack returning nil does not by
// itself prove that the broker has the acknowledgements: JetStream and
// RabbitMQ acks are written to the connection without a reply, and Kafka
// commits an offset only once every record before it was acknowledged. A
// claim counts as settled in the replica's progress record only once
// ConfirmAcks said so for its batch.
type Confirmer interface {
	// ConfirmAcks is called off the hot path (every few hundred
	// milliseconds, and once when the loop stops) with the batches whose
	// Ack returned, successfully or not, and that are not confirmed yet,
	// oldest first. It returns, per batch, whether the broker has now
	// confirmed the acknowledgement of every message of it: a round trip
	// on the same connection after the acks (JetStream, RabbitMQ) or a
	// committed offset past them (Kafka). An adapter may send an
	// acknowledgement again to get that proof (acknowledging twice is
	// harmless). err says why some could not be confirmed; the batches are
	// offered again the next time.
	ConfirmAcks(ctx context.Context, batches [][]Message) ([]bool, error)
}

// ConfirmRefer is implemented by a Confirmer whose Message.Ref holds the
// whole record (JetStream's message, Kafka's record, body included): what
// ConfirmAcks needs of it, which the consumer keeps instead of Ref while the
// acknowledgement awaits confirmation, so the bodies are not kept alive for
// it. ConfirmAcks takes either.
type ConfirmRefer interface {
	ConfirmRef(m Message) any
}

// CreationTimer is implemented by a Source whose broker records when the
// consumer it reads was created (JetStream). The replica's progress record
// keeps it, so a prune run can tell a re-created consumer (whose readings
// prove nothing about this replica's claims) from the one it consumed.
type CreationTimer interface {
	ConsumerCreated() time.Time
}
