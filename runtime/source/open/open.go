// Package open builds the broker adapter the runtime config names. It is
// the one place that knows every adapter, so the binary and the tests open
// sources the same way.
package open

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
	"github.com/idempotency-dev/idc-operator/runtime/source/jetstream"
	"github.com/idempotency-dev/idc-operator/runtime/source/kafka"
	"github.com/idempotency-dev/idc-operator/runtime/source/rabbitmq"
	"github.com/idempotency-dev/idc-operator/runtime/source/redisstreams"
)

// clientPrefix starts every connection/client name, so broker operators can
// tell runtime connections apart from their own.
const clientPrefix = "idc-runtime"

// Open connects to the broker of cfg.Source. consumerName identifies this
// replica (the pod name): it is the Redis consumer name within the group
// (which is what lets a restarted container with the same pod name re-read
// its own pending entries at once), and it names the NATS connection, the
// RabbitMQ connection and the Kafka client id so each replica is visible on
// the broker.
//
// Kafka deliberately does not get it as a static group.instance.id: pod
// names of a Deployment change on every rollout, and a static member that
// goes away does not leave the group, so each rollout would stall its
// partitions for a whole session timeout.
func Open(ctx context.Context, cfg *config.Config, logger logr.Logger, consumerName string) (source.Source, error) {
	if consumerName == "" {
		return nil, errors.New("while opening the source: a consumer name is required")
	}
	s := cfg.Source
	clientName := clientPrefix + "/" + consumerName
	switch {
	case s.NATSJetStream != nil:
		return wrap(jetstream.New(ctx, s.NATSJetStream, logger, jetstream.WithClientName(clientName), jetstream.WithDelivery(cfg.Delivery)))
	case s.Kafka != nil:
		return wrap(kafka.New(ctx, s.Kafka, logger, kafka.WithClientOptions(kgo.ClientID(clientName)), kafka.WithDelivery(cfg.Delivery)))
	case s.RabbitMQ != nil:
		return wrap(rabbitmq.New(ctx, s.RabbitMQ, logger, rabbitmq.WithConnectionName(clientName)))
	case s.RedisStreams != nil:
		return wrap(redisstreams.New(ctx, s.RedisStreams, logger, redisstreams.WithConsumerName(consumerName)))
	}
	return nil, errors.New("while opening the source: exactly one of natsJetStream, kafka, rabbitmq, redisStreams must be set")
}

// wrap turns a typed (*Adapter, error) into (source.Source, error) without
// the typed-nil-in-interface trap, and names the step in the error.
func wrap[S source.Source](s S, err error) (source.Source, error) {
	if err != nil {
		return nil, fmt.Errorf("while opening the source: %w", err)
	}
	return s, nil
}
