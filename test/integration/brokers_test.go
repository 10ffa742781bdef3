package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// natsURL is the NATS JetStream server of the run (TestMain): the built
// nats-server 2.15.3 the suite starts itself, or with IDC_TEST_NATS=system
// the machine's (Debian's 2.9.10 on 127.0.0.1:4222).
var natsURL string

const (
	redisAddr = "127.0.0.1:6379"
	amqpURI   = "amqp://guest:guest@127.0.0.1:5672/"
	// amqpURIEnv is the variable the RabbitMQ config names; the adapter
	// reads the URI (credentials included) from it.
	amqpURIEnv = "IDC_INTEGRATION_AMQP_URI"
)

// outgoing is one message to publish. A duplicate is the same id and body
// published again as a new broker message (a producer retry).
type outgoing struct {
	id   string
	body []byte
}

// broker is one source under test: a stream/topic/queue and a durable
// consumer/group private to the test.
type broker interface {
	name() string
	sourceConfig() config.Source
	publish(t *testing.T, msgs []outgoing)
	// drained returns an error unless every published message has been
	// acknowledged. Call it once every consumer has stopped.
	drained(ctx context.Context) error
}

func uniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
}

// --- NATS JetStream ---

type jetStreamBroker struct {
	js       jetstream.JetStream
	stream   string
	subject  string
	consumer string
	ackWait  time.Duration
}

// newJetStream creates a stream and its durable pull consumer with the
// given AckWait (the redelivery lease), both deleted at the end.
func newJetStream(t *testing.T, ackWait time.Duration) *jetStreamBroker {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatalf("NATS JetStream at %s is required for this test: %v", natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2000))
	if err != nil {
		t.Fatal(err)
	}
	id := time.Now().UnixNano()
	b := &jetStreamBroker{js: js, stream: fmt.Sprintf("IDC_IT_%d", id), subject: fmt.Sprintf("idc.it.%d", id), consumer: "projector", ackWait: ackWait}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: b.stream, Subjects: []string{b.subject + ".>"}}); err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, b.stream)
	})
	_, err = js.CreateConsumer(ctx, b.stream, jetstream.ConsumerConfig{
		Durable: b.consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxAckPending: 10000,
	})
	if err != nil {
		t.Fatalf("creating consumer: %v", err)
	}
	return b
}

func (b *jetStreamBroker) name() string { return "NATSJetStream" }

func (b *jetStreamBroker) sourceConfig() config.Source {
	return config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: b.stream, Consumer: b.consumer}}
}

func (b *jetStreamBroker) publish(t *testing.T, msgs []outgoing) {
	t.Helper()
	for _, m := range msgs {
		if _, err := b.js.PublishAsync(b.subject+".orders", m.body); err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishing did not complete in 30s")
	}
}

func (b *jetStreamBroker) info(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	c, err := b.js.Consumer(ctx, b.stream, b.consumer)
	if err != nil {
		return nil, fmt.Errorf("while reading the consumer: %w", err)
	}
	return c.Info(ctx)
}

func (b *jetStreamBroker) drained(ctx context.Context) error {
	info, err := b.info(ctx)
	if err != nil {
		return err
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		return fmt.Errorf("JetStream consumer has %d undelivered and %d unacknowledged messages", info.NumPending, info.NumAckPending)
	}
	return nil
}

// --- Kafka (kfake) ---

// There is no Kafka server on this machine: Kafka runs as franz-go's
// in-process kfake cluster, which speaks the Kafka protocol over loopback
// (consumer groups, rebalances, offset commits included).
type kafkaBroker struct {
	cluster *kfake.Cluster
	cl      *kgo.Client
	topic   string
	group   string
}

func newKafka(t *testing.T, partitions int32) *kafkaBroker {
	t.Helper()
	b := &kafkaBroker{topic: uniqueName("idc-it"), group: uniqueName("idc-it-group")}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, b.topic))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	b.cluster = c
	if b.cl, err = kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.cl.Close)
	return b
}

func (b *kafkaBroker) name() string { return "Kafka" }

func (b *kafkaBroker) sourceConfig() config.Source {
	return config.Source{Kafka: &config.Kafka{BootstrapServers: b.cluster.ListenAddrs(), Topics: []string{b.topic}, ConsumerGroup: b.group}}
}

func (b *kafkaBroker) publish(t *testing.T, msgs []outgoing) {
	t.Helper()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Topic: b.topic, Value: m.body}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
}

func (b *kafkaBroker) drained(ctx context.Context) error {
	adm := kadm.NewClient(b.cl)
	ends, err := adm.ListEndOffsets(ctx, b.topic)
	if err != nil {
		return fmt.Errorf("while listing end offsets: %w", err)
	}
	committed, err := adm.FetchOffsets(ctx, b.group)
	if err != nil {
		return fmt.Errorf("while fetching the group's offsets: %w", err)
	}
	var errs []error
	ends.Each(func(o kadm.ListedOffset) {
		c, ok := committed.Lookup(o.Topic, o.Partition)
		if o.Offset == 0 {
			return // an empty partition has nothing to commit
		}
		if !ok || c.At != o.Offset {
			errs = append(errs, fmt.Errorf("partition %d: committed %d, end %d", o.Partition, c.At, o.Offset))
		}
	})
	return errors.Join(errs...)
}

// --- RabbitMQ ---

type rabbitBroker struct {
	conn  *amqp.Connection
	ch    *amqp.Channel
	queue string
}

func newRabbitMQ(t *testing.T) *rabbitBroker {
	t.Helper()
	t.Setenv(amqpURIEnv, amqpURI)
	conn, err := amqp.Dial(amqpURI)
	if err != nil {
		t.Fatalf("RabbitMQ at 127.0.0.1:5672 is required for this test: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	b := &rabbitBroker{conn: conn, ch: ch, queue: uniqueName("idc-it")}
	if _, err := ch.QueueDeclare(b.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatalf("declaring queue: %v", err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(b.queue, false, false, false) })
	return b
}

func (b *rabbitBroker) name() string { return "RabbitMQ" }

func (b *rabbitBroker) sourceConfig() config.Source {
	return config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: amqpURIEnv, Queue: b.queue}}
}

func (b *rabbitBroker) publish(t *testing.T, msgs []outgoing) {
	t.Helper()
	before, err := b.ready()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		err := b.ch.PublishWithContext(context.Background(), "", b.queue, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Body: m.body,
		})
		if err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	// Publishing is asynchronous: wait until the queue holds them, so the
	// test's expectations do not race the broker.
	waitFor(t, 30*time.Second, "the queue to hold every published message", func() error {
		n, err := b.ready()
		if err == nil && n < before+len(msgs) {
			err = fmt.Errorf("%d of %d ready", n-before, len(msgs))
		}
		return err
	})
}

// ready is the number of messages ready for delivery; unacknowledged ones
// count again once their consumer's channel closed.
func (b *rabbitBroker) ready() (int, error) {
	q, err := b.ch.QueueDeclarePassive(b.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		return 0, fmt.Errorf("while inspecting queue %s: %w", b.queue, err)
	}
	return q.Messages, nil
}

func (b *rabbitBroker) drained(context.Context) error {
	n, err := b.ready()
	if err != nil {
		return err
	}
	if n != 0 {
		return fmt.Errorf("queue %s still holds %d messages", b.queue, n)
	}
	return nil
}

// --- Redis Streams ---

type redisBroker struct {
	rdb          *redis.Client
	stream       string
	group        string
	claimMinIdle time.Duration
}

func newRedis(t *testing.T, claimMinIdle time.Duration) *redisBroker {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis at %s is required for this test: %v", redisAddr, err)
	}
	b := &redisBroker{rdb: rdb, stream: uniqueName("idc-it"), group: "projector", claimMinIdle: claimMinIdle}
	t.Cleanup(func() {
		_ = rdb.Del(context.Background(), b.stream).Err()
		_ = rdb.Close()
	})
	return b
}

func (b *redisBroker) name() string { return "RedisStreams" }

func (b *redisBroker) sourceConfig() config.Source {
	return config.Source{RedisStreams: &config.RedisStreams{Address: redisAddr, Stream: b.stream, Group: b.group,
		ClaimMinIdle: config.Duration{Duration: b.claimMinIdle}}}
}

func (b *redisBroker) publish(t *testing.T, msgs []outgoing) {
	t.Helper()
	pipe := b.rdb.Pipeline()
	for _, m := range msgs {
		pipe.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: []any{"body", m.body}})
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatalf("XADD: %v", err)
	}
}

func (b *redisBroker) drained(ctx context.Context) error {
	groups, err := b.rdb.XInfoGroups(ctx, b.stream).Result()
	if err != nil {
		return fmt.Errorf("while reading the stream's groups: %w", err)
	}
	for _, g := range groups {
		if g.Name != b.group {
			continue
		}
		if g.Pending != 0 || g.Lag != 0 {
			return fmt.Errorf("group %s has %d pending and %d unread entries", g.Name, g.Pending, g.Lag)
		}
		return nil
	}
	return fmt.Errorf("group %s not found on stream %s (groups: %s)", b.group, b.stream, groupNames(groups))
}

func groupNames(gs []redis.XInfoGroup) string {
	names := make([]string, len(gs))
	for i, g := range gs {
		names[i] = g.Name
	}
	return strings.Join(names, ",")
}

// waitFor polls cond until it returns nil, failing the test after timeout
// with cond's last error.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
