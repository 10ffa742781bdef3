package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// --- the rows ---

// latencyJetStream is JetStream -> upsert at replicas x batch, rate msgs/s.
func (t *throughputEnv) latencyJetStream(b *testing.B, replicas, batch int, batching config.Batching, rate, load float64) latencyRow {
	b.Helper()
	return t.latencyJetStreamNamed(b, "jetstream_upsert", replicas, batch, batching, rate, load)
}

func (t *throughputEnv) latencyJetStreamNamed(b *testing.B, name string, replicas, batch int, batching config.Batching, rate, load float64) latencyRow {
	b.Helper()
	return t.latencyJetStreamBy(b, name, replicas, batch, batching, rate, load, runtimeConsumer)
}

// latencyJetStreamBy is the JetStream latency row consumed by cons (the
// runtime, or the floor consumer).
func (t *throughputEnv) latencyJetStreamBy(b *testing.B, name string, replicas, batch int, batching config.Batching, rate, load float64,
	cons latencyConsumer) latencyRow {
	b.Helper()
	ctx := context.Background()
	t.runs++
	stream := fmt.Sprintf("IDC_LAT_%d_%d", time.Now().UnixNano(), t.runs)
	if _, err := t.nats.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}}); err != nil {
		b.Fatalf("creating stream: %v", err)
	}
	defer func() { _ = t.nats.js.DeleteStream(context.Background(), stream) }()
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{NATSJetStream: &config.JetStream{URL: t.nats.url(), Stream: stream, Consumer: "c_" + schema}}, batch)
	cfg.Delivery.Batching = batching
	nc, err := nats.Connect(t.nats.url())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	subject := stream + ".orders"
	r := t.latencyRunWith(b, name, cfg, replicas, rate, load, latencyPublisher{
		// Core publishes into the stream's subject: the cheapest producer,
		// so the producer's own work takes the least from the two cores.
		send:  func(_ int, body []byte) error { return nc.Publish(subject, body) },
		flush: func() error { return nil }, // nats.go's flusher writes as soon as it can
	}, cons)
	r.nats = t.nats.version()
	return r
}

func (t *throughputEnv) latencyRabbitMQ(b *testing.B, rate, load float64) latencyRow {
	b.Helper()
	q := t.emptyRabbitQueue(b)
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: amqpURIEnv, Queue: q}}, batchSize)
	conn, err := amqp.Dial(amqpURI)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	return t.latencyRun(b, "rabbitmq_upsert", cfg, 2, rate, load, latencyPublisher{
		send: func(_ int, body []byte) error {
			return ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Body: body})
		},
		flush: func() error { return nil },
	})
}

func (t *throughputEnv) emptyRabbitQueue(b *testing.B) string {
	b.Helper()
	conn, err := amqp.Dial(amqpURI)
	if err != nil {
		b.Fatalf("RabbitMQ at 127.0.0.1:5672 is required for the benchmark: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q := fmt.Sprintf("idc-lat-%d", time.Now().UnixNano())
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if c, err := amqp.Dial(amqpURI); err == nil {
			if ch, err := c.Channel(); err == nil {
				_, _ = ch.QueueDelete(q, false, false, false)
			}
			_ = c.Close()
		}
	})
	return q
}

func (t *throughputEnv) latencyRedis(b *testing.B, rate, load float64) latencyRow {
	b.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	stream := fmt.Sprintf("idc-lat-%d", time.Now().UnixNano())
	defer func() { _ = rdb.Del(context.Background(), stream).Err() }()
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{RedisStreams: &config.RedisStreams{Address: redisAddr, Stream: stream, Group: "g"}}, batchSize)
	pipe := rdb.Pipeline()
	return t.latencyRun(b, "redis_upsert", cfg, 2, rate, load, latencyPublisher{
		// A burst's entries go out in one pipeline after their stamps:
		// their latency includes the wait for the burst's last XADD.
		send: func(_ int, body []byte) error {
			pipe.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{"body", body}})
			return nil
		},
		flush: func() error {
			if pipe.Len() == 0 {
				return nil
			}
			_, err := pipe.Exec(context.Background())
			return err
		},
	})
}

func (t *throughputEnv) latencyKafka(b *testing.B, rate, load float64) latencyRow {
	b.Helper()
	const topic = "idc-lat"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic))
	if err != nil {
		b.Fatal(err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{Kafka: &config.Kafka{BootstrapServers: cluster.ListenAddrs(), Topics: []string{topic}, ConsumerGroup: "g"}}, batchSize)
	var mu sync.Mutex
	var produceErr error
	r := t.latencyRun(b, "kafka_kfake_upsert", cfg, 2, rate, load, latencyPublisher{
		send: func(n int, body []byte) error {
			cl.Produce(context.Background(), &kgo.Record{Key: []byte(fmt.Sprintf("k%05d", n%latencyKeys)), Value: body}, func(_ *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					produceErr = err
					mu.Unlock()
				}
			})
			mu.Lock()
			defer mu.Unlock()
			return produceErr
		},
		flush: func() error { return nil },
	})
	r.note = "kfake in-process: NOT representative of a real Kafka broker"
	return r
}

// latencyPoint is one of the JetStream latency rows: a share of the
// measured maximum and the batching.
type latencyPoint struct {
	load     float64
	batching config.Batching
}

// latencyPoints are latencyRows' JetStream rows, in order: 10%, 50% and
// 90% of the measured maximum, and 10% and 90% again with batching Fixed.
var latencyPoints = []latencyPoint{
	{0.1, config.BatchingAdaptive}, {0.1, config.BatchingFixed},
	{0.5, config.BatchingAdaptive},
	{0.9, config.BatchingAdaptive}, {0.9, config.BatchingFixed},
}

// latencyRows prints the LATENCY lines: JetStream -> upsert at 2 x 500 at
// latencyPoints of jetStreamMax (the headline row of this run) and at 50%
// of what the machine sustains (jetStreamLatencyRows), and RabbitMQ,
// Redis Streams and Kafka (kfake) at 50% of their own rows (a zero rate
// skips the row).
//
// It returns what the machine sustains end to end: the most a 90% row
// committed when one fell behind, else jetStreamMax.
func (t *throughputEnv) latencyRows(b *testing.B, jetStreamMax, rabbitMax, redisMax, kafkaMax float64) float64 {
	b.Helper()
	sustained := t.jetStreamLatencyRows(b, jetStreamMax, latencyPoints)
	t.brokerLatencyRows(b, rabbitMax, redisMax, kafkaMax)
	return sustained
}

// jetStreamLatencyRows prints the LATENCY lines of JetStream -> upsert at
// 2 x 500 at points (shares of jetStreamMax), then at 50% of what the
// machine sustains (row jetstream_upsert_sustained). The 10% Adaptive row
// and the sustained row run again on every other NATS server of the run,
// at the same offered rate, each right after the rows' server's
// (latencyAcross: RATIO nats_<a>_vs_<b>_latency_p99_10pct and
// _50pct_of_sustained).
//
// It returns what the machine sustains end to end: the most a 90% row
// committed when one fell behind, else jetStreamMax.
func (t *throughputEnv) jetStreamLatencyRows(b *testing.B, jetStreamMax float64, points []latencyPoint) float64 {
	b.Helper()
	// sustained is the most a 90% row committed; it is what the machine
	// sustains once one of them fell behind.
	sustained, behind := 0.0, false
	for _, p := range points {
		run := func() latencyRow {
			return t.latencyJetStream(b, 2, batchSize, p.batching, p.load*jetStreamMax, p.load)
		}
		r := run()
		printLatency(r)
		if p.load == 0.1 && p.batching == config.BatchingAdaptive {
			t.latencyAcross(b, "10pct", r, run)
		}
		if p.load == 0.9 {
			behind = behind || r.achieved < 0.95*r.offered
			sustained = max(sustained, r.achieved)
		}
	}
	if behind {
		// The maximum above is a pre-filled backlog drained with nothing
		// else running. Here the producer and the broker's ingest share
		// the two cores with the runtime and PostgreSQL: a 90% row that
		// fell behind committed what the machine sustains end to end.
		fmt.Printf("RATIO latency_sustained_vs_backlog_max=%.2f\n", sustained/jetStreamMax)
	} else {
		sustained = jetStreamMax
	}
	// Half of what the machine sustains is the load a user can size for
	// on this machine (when no 90% row fell behind, the 50% row's load
	// again).
	run := func() latencyRow {
		r := t.latencyJetStreamNamed(b, "jetstream_upsert_sustained", 2, batchSize, config.BatchingAdaptive, 0.5*sustained, 0.5)
		r.loadOf = "sustained_max"
		return r
	}
	r := run()
	printLatency(r)
	t.latencyAcross(b, "50pct_of_sustained", r, run)
	return sustained
}

// brokerLatencyRows prints the RabbitMQ, Redis Streams and Kafka (kfake)
// LATENCY lines at 50% of their own rows (a zero rate skips the row).
func (t *throughputEnv) brokerLatencyRows(b *testing.B, rabbitMax, redisMax, kafkaMax float64) {
	b.Helper()
	if rabbitMax > 0 {
		printLatency(t.latencyRabbitMQ(b, 0.5*rabbitMax, 0.5))
	}
	if redisMax > 0 {
		printLatency(t.latencyRedis(b, 0.5*redisMax, 0.5))
	}
	if kafkaMax > 0 {
		printLatency(t.latencyKafka(b, 0.5*kafkaMax, 0.5))
	}
}
