package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// JetStreamPublisher publishes outbox events to one subject with
// Nats-Msg-Id = the event id: JetStream drops a repeat within the stream's
// duplicate window, the next IdempotentConsumer (message.id.header:
// Nats-Msg-Id) dedupes beyond it.
type JetStreamPublisher struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	subject string
}

// NewJetStreamPublisher connects to cfg.URL with the credentials and TLS the
// config names (environment variables filled from Secrets).
func NewJetStreamPublisher(cfg *config.EmitJetStream) (*JetStreamPublisher, error) {
	// Reconnecting forever, nats.go's 2 s apart.
	opts, err := brokerconn.NATSOptions(cfg.CredentialsEnv, cfg.TLS, nil, brokerconn.NATS{Name: "idc-runtime outbox relay", Reconnect: true})
	if err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	nc, js, err := brokerconn.ConnectJetStream(cfg.URL, opts)
	if err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	return &JetStreamPublisher{nc: nc, js: js, subject: cfg.Subject}, nil
}

// Publish sends every event asynchronously, then waits for the acks in
// order: the count is the prefix the stream confirmed.
func (p *JetStreamPublisher) Publish(ctx context.Context, events []inbox.PendingEvent) (int, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(events))
	var sendErr error
	for _, e := range events {
		msg := &nats.Msg{Subject: p.subject, Data: e.Payload, Header: nats.Header{}}
		for k, v := range e.Headers {
			msg.Header.Set(k, v)
		}
		msg.Header.Set(jetstream.MsgIDHeader, e.EventID)
		msg.Header.Set(config.EventIDHeader, e.EventID)
		f, err := p.js.PublishMsgAsync(msg)
		if err != nil {
			sendErr = err
			if errors.Is(err, nats.ErrMaxPayload) {
				sendErr = fmt.Errorf("%w: event %s: %w", ErrRejected, e.EventID, err)
			}
			break
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return i, fmt.Errorf("while publishing event %s to %s: %w", events[i].EventID, p.subject, err)
		case <-ctx.Done():
			return i, fmt.Errorf("while waiting for the ack of event %s: %w", events[i].EventID, ctx.Err())
		}
	}
	if sendErr != nil {
		return len(futures), fmt.Errorf("while publishing to %s: %w", p.subject, sendErr)
	}
	return len(futures), nil
}

// Close closes the connection.
func (p *JetStreamPublisher) Close() { p.nc.Close() }
