package retention

// Kafka here is franz-go's in-process kfake cluster: no Kafka server exists
// on this machine.

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const lagPublished = 500

func wantLag(t *testing.T, cfg *config.Config, getenv Getenv, want int64) {
	t.Helper()
	var got int64
	var err error
	// RabbitMQ's management statistics trail the queue by a few seconds.
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err = Lag(testCtx(t), cfg, getenv)
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lag = %d, %v; want %d", got, err, want)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func TestLagJetStream(t *testing.T) {
	js := natsJS(t)
	name := unique("IDC_LAG")
	createStream(t, js, jetstream.StreamConfig{Name: name})
	c, err := js.CreateConsumer(testCtx(t), name, jetstream.ConsumerConfig{Durable: "projector", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	cfg := jsConfig(name, "projector", config.Retention{})
	wantLag(t, cfg, nil, 0)
	for i := range lagPublished {
		if _, err := js.Publish(testCtx(t), strings.ToLower(name)+".orders", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	wantLag(t, cfg, nil, lagPublished)
	// A batch in flight (delivered, not acked) is still backlog.
	batch, err := c.Fetch(50, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range batch.Messages() {
		n++
	}
	if n != 50 {
		t.Fatalf("fetched %d, want 50", n)
	}
	wantLag(t, cfg, nil, lagPublished)
}

func TestLagKafka(t *testing.T) {
	c, adm := kfakeCluster(t, kfake.SeedTopics(2, "orders"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	for i := range lagPublished {
		rec := &kgo.Record{Key: []byte(strconv.Itoa(i)), Value: []byte(strconv.Itoa(i))}
		if err := cl.ProduceSync(testCtx(t), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cfg := kafkaCfg(c, config.Retention{}, "orders")
	// The group has committed nothing: everything is backlog.
	wantLag(t, cfg, nil, lagPublished)
	// Commit 100 records of partition 0: they are no longer backlog.
	offsets := kadm.Offsets{}
	offsets.Add(kadm.Offset{Topic: "orders", Partition: 0, At: 100, LeaderEpoch: -1})
	if _, err := adm.CommitOffsets(testCtx(t), "projector", offsets); err != nil {
		t.Fatal(err)
	}
	wantLag(t, cfg, nil, lagPublished-100)
}

func TestLagRabbitMQ(t *testing.T) {
	ch := amqpChannel(t)
	q := declareQueue(t, ch, nil)
	for i := range lagPublished {
		if err := ch.PublishWithContext(testCtx(t), "", q, false, false, amqp.Publishing{Body: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := baseConfig(config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: amqpEnv, Queue: q, ManagementURL: mgmtURL}}, config.Retention{})
	wantLag(t, cfg, rabbitEnv, lagPublished)
	// 50 delivered and unacked are still backlog (ready + unacked).
	if err := ch.Qos(50, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		<-deliveries
	}
	wantLag(t, cfg, rabbitEnv, lagPublished)
}

func TestLagRedisStreams(t *testing.T) {
	rdb := redisClient(t)
	stream := unique("idc-lag")
	t.Cleanup(func() { rdb.Del(testCtx(t), stream) })
	if err := rdb.XGroupCreateMkStream(testCtx(t), stream, "projector", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range lagPublished {
		if err := rdb.XAdd(testCtx(t), &redis.XAddArgs{Stream: stream, Values: map[string]any{"body": strconv.Itoa(i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cfg := redisCfg(stream, config.Retention{})
	wantLag(t, cfg, nil, lagPublished)
	// XINFO GROUPS lag counts entries not yet delivered to the group: a
	// batch in flight of 50 leaves 450.
	if err := rdb.XReadGroup(testCtx(t), &redis.XReadGroupArgs{Group: "projector", Consumer: "c", Streams: []string{stream, ">"}, Count: 50}).Err(); err != nil {
		t.Fatal(err)
	}
	wantLag(t, cfg, nil, lagPublished-50)
}

func TestLagOfAMissingConsumerIsSourceNotFound(t *testing.T) {
	js := natsJS(t)
	name := unique("IDC_LAG")
	createStream(t, js, jetstream.StreamConfig{Name: name})
	_, err := Lag(testCtx(t), jsConfig(name, "nobody", config.Retention{}), nil)
	if !errors.Is(err, ErrSourceNotFound) {
		t.Fatalf("lag of a missing consumer: %v, want ErrSourceNotFound", err)
	}
}
