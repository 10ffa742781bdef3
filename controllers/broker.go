package controllers

import (
	"context"
	"errors"
	"time"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// brokerTimeout bounds one broker read of a pass.
const brokerTimeout = 15 * time.Second

// BrokerReading is what one read of the broker returned.
type BrokerReading struct {
	// Result is the derived window with its inputs and the consumer's
	// broker-side limits (see retention.Derive).
	Result retention.Result
	// Lag is the broker's backlog for the consumer; nil when it could not
	// be read (the window may still have been).
	Lag *int64
	// ConsumerMissing: the broker answered that the consumer (JetStream
	// durable, Redis group, RabbitMQ queue, Kafka topic) the lag is read
	// from does not exist yet. The runtime creates it on its first start.
	ConsumerMissing bool
	// PartitionLags is each partition's backlog, indexed by partition
	// (natsJetStream.partitions; nil entries were not read).
	PartitionLags []*int64
}

// BrokerObserver reads the broker of one resource: the window's inputs, the
// consumer's limits and its lag, over one connection. Errors are
// retention.Derive's (ErrBrokerUnreachable, ErrSourceNotFound,
// ErrUnboundedReplay with the Result still filled in, ErrInvalidSpec).
type BrokerObserver interface {
	Observe(ctx context.Context, cfg *config.Config, getenv func(string) string, now time.Time) (BrokerReading, error)
}

// LiveBroker is the BrokerObserver on runtime/retention, the code the prune
// job and the runtime's lag gauge run.
type LiveBroker struct{}

// Observe implements BrokerObserver.
func (LiveBroker) Observe(ctx context.Context, cfg *config.Config, getenv func(string) string, now time.Time) (BrokerReading, error) {
	rd, err := retention.Read(ctx, cfg, getenv, now)
	out := BrokerReading{Result: rd.Result}
	if rd.LagErr == nil {
		lag := rd.Lag
		out.Lag = &lag
	}
	out.ConsumerMissing = errors.Is(rd.LagErr, retention.ErrSourceNotFound)
	if len(rd.Partitions) > 0 {
		out.PartitionLags = make([]*int64, len(rd.Partitions))
		for _, p := range rd.Partitions {
			if p.Err == nil && p.Index >= 0 && p.Index < len(out.PartitionLags) {
				lag := p.Lag
				out.PartitionLags[p.Index] = &lag
			}
		}
	}
	return out, err
}

// brokerReading is a read kept between passes: the broker is read at most
// once per --retention-period (and at once when the source, the retention
// spec or a referenced Secret changes), a failed read again after
// --recheck-period.
type brokerReading struct {
	key     string
	at      time.Time
	reading BrokerReading
	err     error
}

// failedRead says whether the broker could not be read; an unbounded
// replay is an answer, not a failure.
func (b *brokerReading) failedRead() bool {
	return b.err != nil && !errors.Is(b.err, retention.ErrUnboundedReplay)
}

// rechecked says the reading is read again within --recheck-period, not
// --retention-period: the broker could not be read, or the consumer does
// not exist yet and awaiting says autoscaling from 0 waits for it
// (autoscalingPhase holds minReplicas at 1 meanwhile).
func (b *brokerReading) rechecked(awaiting bool) bool {
	return b.failedRead() || (awaiting && b.reading.ConsumerMissing)
}

func (b *brokerReading) ttl(period, recheck time.Duration, awaiting bool) time.Duration {
	if b.rechecked(awaiting) {
		return min(period, recheck)
	}
	return period
}

// dueIn is how long until the reading is stale.
func (b *brokerReading) dueIn(now time.Time, period, recheck time.Duration, awaiting bool) time.Duration {
	return b.at.Add(b.ttl(period, recheck, awaiting)).Sub(now)
}

// awaitsConsumer says the resource scales from 0 under KEDA, whose scaler
// reads the lag from the broker's consumer: while that does not exist the
// reading is rechecked (brokerReading.rechecked).
func awaitsConsumer(idc *messagingv1alpha1.IdempotentConsumer) bool {
	a := autoscaled(idc)
	return a != nil && a.MinReplicasOrDefault() == 0
}
