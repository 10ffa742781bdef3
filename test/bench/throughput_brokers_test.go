package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
	"github.com/idempotency-dev/idc-operator/runtime/source/rabbitmq"
	"github.com/idempotency-dev/idc-operator/runtime/source/redisstreams"
)

// --- RabbitMQ ---

// rabbitQueue declares a durable classic queue holding the workload.
func (t *throughputEnv) rabbitQueue(b *testing.B) string {
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
	q := fmt.Sprintf("idc-bench-%d", time.Now().UnixNano())
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
	if err := ch.Confirm(false); err != nil {
		b.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, len(t.w.bodies)))
	for _, body := range t.w.bodies {
		if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Body: body,
		}); err != nil {
			b.Fatal(err)
		}
	}
	for range t.w.bodies {
		if c := <-confirms; !c.Ack {
			b.Fatal("RabbitMQ refused a published message")
		}
	}
	return q
}

func (t *throughputEnv) runRabbitMQ(b *testing.B, replicas, batch int) row {
	b.Helper()
	q := t.rabbitQueue(b)
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: amqpURIEnv, Queue: q}}, batch)
	rs := t.startReplicas(b, cfg, replicas)
	timed, elapsed, rss := rs.measure(b, "rabbitmq", len(t.w.bodies))
	t.checkResult(b, schema)
	return row{name: "rabbitmq_upsert", replicas: replicas, batch: batch, msgs: timed, elapsed: elapsed, rssMiB: rss, note: "classic durable queue", cpu: rs.cpu}
}

func (t *throughputEnv) rabbitAlone(b *testing.B, n int) row {
	b.Helper()
	q := t.rabbitQueue(b)
	b.Setenv(amqpURIEnv, amqpURI)
	cfg := &config.RabbitMQ{URIEnv: amqpURIEnv, Queue: q, Prefetch: 2 * batchSize * 2}
	return consumeAlone(b, "rabbitmq_alone", len(t.w.bodies), func(int) source.Source {
		s, err := rabbitmq.New(context.Background(), cfg, logr.Discard())
		if err != nil {
			b.Fatal(err)
		}
		return s
	}, n, t.nats.pid)
}

// --- Redis Streams ---

func (t *throughputEnv) redisStream(b *testing.B) string {
	b.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		b.Fatalf("Redis at %s is required for the benchmark: %v", redisAddr, err)
	}
	stream := fmt.Sprintf("idc-bench-%d", time.Now().UnixNano())
	for i := 0; i < len(t.w.bodies); i += 1000 {
		pipe := rdb.Pipeline()
		for _, body := range t.w.bodies[i:min(i+1000, len(t.w.bodies))] {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"body", body}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		c := redis.NewClient(&redis.Options{Addr: redisAddr})
		_ = c.Del(context.Background(), stream).Err()
		_ = c.Close()
	})
	return stream
}

func (t *throughputEnv) runRedis(b *testing.B, replicas, batch int) row {
	b.Helper()
	stream := t.redisStream(b)
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{RedisStreams: &config.RedisStreams{Address: redisAddr, Stream: stream, Group: "g"}}, batch)
	rs := t.startReplicas(b, cfg, replicas)
	timed, elapsed, rss := rs.measure(b, "redis", len(t.w.bodies))
	t.checkResult(b, schema)
	return row{name: "redis_upsert", replicas: replicas, batch: batch, msgs: timed, elapsed: elapsed, rssMiB: rss}
}

func (t *throughputEnv) redisAlone(b *testing.B, n int) row {
	b.Helper()
	stream := t.redisStream(b)
	cfg := &config.RedisStreams{Address: redisAddr, Stream: stream, Group: "g", BodyField: "body", ClaimMinIdle: config.Duration{Duration: time.Minute}}
	return consumeAlone(b, "redis_alone", len(t.w.bodies), func(i int) source.Source {
		s, err := redisstreams.New(context.Background(), cfg, logr.Discard(), redisstreams.WithConsumerName(fmt.Sprintf("alone-%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		return s
	}, n, t.nats.pid)
}

// --- Kafka (kfake) ---

// runKafka runs the binary against franz-go's in-process kfake cluster: the
// only Kafka on this machine, and not representative of a real broker (no
// disk, no replication, and it shares the benchmark's process and cores).
func (t *throughputEnv) runKafka(b *testing.B, replicas, batch int) row {
	b.Helper()
	const topic = "idc-bench"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(2*replicas), topic))
	if err != nil {
		b.Fatal(err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	recs := make([]*kgo.Record, len(t.w.bodies))
	for i, body := range t.w.bodies {
		var o order
		_ = json.Unmarshal(body, &o)
		recs[i] = &kgo.Record{Key: []byte(o.Key), Value: body}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
	cl.Close()
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{Kafka: &config.Kafka{BootstrapServers: cluster.ListenAddrs(), Topics: []string{topic}, ConsumerGroup: "g"}}, batch)
	rs := t.startReplicas(b, cfg, replicas)
	timed, elapsed, rss := rs.measure(b, "kafka", len(t.w.bodies))
	t.checkResult(b, schema)
	return row{name: "kafka_kfake_upsert", replicas: replicas, batch: batch, msgs: timed, elapsed: elapsed, rssMiB: rss,
		note: "kfake in-process: NOT representative of a real Kafka broker; kfake ignores fetch max bytes (one fetch returns a whole partition), so this RSS is kfake's buffering, not the runtime's"}
}
