package outbox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// NewPublisher opens the publisher of the configured emit target.
func NewPublisher(cfg *config.Emit) (Publisher, error) {
	switch {
	case cfg.NATSJetStream != nil:
		return NewJetStreamPublisher(cfg.NATSJetStream)
	case cfg.Kafka != nil:
		return newKafkaPublisher(cfg.Kafka)
	case cfg.RabbitMQ != nil:
		return newRabbitMQPublisher(cfg.RabbitMQ)
	case cfg.RedisStreams != nil:
		return newRedisPublisher(cfg.RedisStreams)
	}
	return nil, errors.New("emit: no target configured")
}

// kafkaPublisher produces with franz-go's idempotent producer (the default:
// a retried produce is written once per producer session) and the event id
// in the Idc-Event-Id header, which the next consumer dedupes on. The
// record key is the row's shard, so one entity key stays in one partition,
// in order.
type kafkaPublisher struct {
	cl    *kgo.Client
	topic string
}

func newKafkaPublisher(cfg *config.EmitKafka) (*kafkaPublisher, error) {
	opts, err := brokerconn.KafkaOptions(cfg.BootstrapServers, cfg.SASL, cfg.TLS, nil, brokerconn.Kafka{})
	if err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))...)
	if err != nil {
		return nil, fmt.Errorf("while creating the Kafka producer for emit: %w", err)
	}
	return &kafkaPublisher{cl: cl, topic: cfg.Topic}, nil
}

func (p *kafkaPublisher) Publish(ctx context.Context, events []inbox.PendingEvent) (int, error) {
	recs := make([]*kgo.Record, len(events))
	for i, e := range events {
		hs := make([]kgo.RecordHeader, 0, len(e.Headers)+1)
		for _, k := range sortedKeys(e.Headers) {
			hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(e.Headers[k])})
		}
		recs[i] = &kgo.Record{Topic: p.topic, Key: []byte(strconv.Itoa(e.Shard)), Value: e.Payload,
			Headers: append(hs, kgo.RecordHeader{Key: config.EventIDHeader, Value: []byte(e.EventID)})}
	}
	results := p.cl.ProduceSync(ctx, recs...)
	for i, r := range results {
		if r.Err != nil {
			err := r.Err
			if errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) {
				err = fmt.Errorf("%w: %w", ErrRejected, err)
			}
			return i, fmt.Errorf("while producing event %s to %s: %w", events[i].EventID, p.topic, err)
		}
	}
	return len(events), nil
}

func (p *kafkaPublisher) Close() { p.cl.Close() }

// rabbitMQPublisher publishes persistent messages with message-id = the
// event id (and the Idc-Event-Id header), mandatory routing and publisher
// confirms: a message no queue took counts as not published.
type rabbitMQPublisher struct {
	mu       sync.Mutex
	conn     *amqp.Connection
	ch       *amqp.Channel
	returned chan amqp.Return
	cfg      *config.EmitRabbitMQ
}

func newRabbitMQPublisher(cfg *config.EmitRabbitMQ) (*rabbitMQPublisher, error) {
	uri, _, err := brokerconn.AMQPURI(cfg.URIEnv, nil)
	if err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	dial, err := brokerconn.AMQPConfig(cfg.TLS, nil, brokerconn.AMQP{})
	if err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	conn, err := amqp.DialConfig(uri, dial)
	if err != nil {
		return nil, fmt.Errorf("while connecting to RabbitMQ for emit (URI from %s): %w", cfg.URIEnv, redactAMQP(err))
	}
	p := &rabbitMQPublisher{conn: conn, cfg: cfg}
	if err := p.open(); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return p, nil
}

// redactAMQP keeps an error's message only when it cannot carry the URI.
func redactAMQP(err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) {
		return err
	}
	return errors.New("dial failed")
}

func (p *rabbitMQPublisher) open() error {
	ch, err := p.conn.Channel()
	if err != nil {
		return fmt.Errorf("while opening a RabbitMQ channel for emit: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("while enabling publisher confirms: %w", err)
	}
	p.ch = ch
	p.returned = ch.NotifyReturn(make(chan amqp.Return, 1024))
	return nil
}

func (p *rabbitMQPublisher) Publish(ctx context.Context, events []inbox.PendingEvent) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch == nil || p.ch.IsClosed() {
		if err := p.open(); err != nil {
			return 0, err
		}
	}
	confirms := make([]*amqp.DeferredConfirmation, 0, len(events))
	var sendErr error
	for _, e := range events {
		headers := amqp.Table{config.EventIDHeader: e.EventID}
		for k, v := range e.Headers {
			headers[k] = v
		}
		c, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, p.cfg.RoutingKey, true, false, amqp.Publishing{
			MessageId: e.EventID, Headers: headers,
			ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: e.Payload,
		})
		if err != nil {
			sendErr = err
			break
		}
		confirms = append(confirms, c)
	}
	for i, c := range confirms {
		ok, err := c.WaitContext(ctx)
		if err != nil || !ok {
			return i, fmt.Errorf("event %s was not confirmed by RabbitMQ (exchange %q): %w", events[i].EventID, p.cfg.Exchange, errors.Join(err, errNacked))
		}
	}
	// A mandatory message no queue took comes back before its confirm.
	for {
		select {
		case r := <-p.returned:
			for i, e := range events {
				if e.EventID == r.MessageId {
					return i, fmt.Errorf("event %s was returned unroutable (exchange %q, routing key %q): %s", e.EventID, p.cfg.Exchange, p.cfg.RoutingKey, r.ReplyText)
				}
			}
		default:
			if sendErr != nil {
				return len(confirms), fmt.Errorf("while publishing to RabbitMQ: %w", sendErr)
			}
			return len(confirms), nil
		}
	}
}

var errNacked = errors.New("nacked or not confirmed")

func (p *rabbitMQPublisher) Close() { _ = p.conn.Close() }

// redisPublisher appends entries (XADD) holding the payload in "body" and
// the event id in the Idc-Event-Id field. Redis has no dedup key: the next
// consumer dedupes on that field.
type redisPublisher struct {
	rdb    *redis.Client
	stream string
}

func newRedisPublisher(cfg *config.EmitRedisStreams) (*redisPublisher, error) {
	o, err := brokerconn.RedisOptions(cfg.Address, cfg.PasswordEnv, cfg.TLS, nil, brokerconn.Redis{})
	if err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	return &redisPublisher{rdb: redis.NewClient(o), stream: cfg.Stream}, nil
}

func (p *redisPublisher) Publish(ctx context.Context, events []inbox.PendingEvent) (int, error) {
	pipe := p.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(events))
	for i, e := range events {
		values := []any{"body", e.Payload, config.EventIDHeader, e.EventID}
		for _, k := range sortedKeys(e.Headers) {
			if k != "body" {
				values = append(values, k, e.Headers[k])
			}
		}
		cmds[i] = pipe.XAdd(ctx, &redis.XAddArgs{Stream: p.stream, Values: values})
	}
	_, _ = pipe.Exec(ctx) // each command's own error is read below
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			return i, fmt.Errorf("while adding event %s to stream %s: %w", events[i].EventID, p.stream, err)
		}
	}
	return len(events), nil
}

func (p *redisPublisher) Close() { _ = p.rdb.Close() }

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
