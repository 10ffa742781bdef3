package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const lagPublished = 500

// TestLagGauge publishes 500 messages to each broker without consuming
// them and reads idc_source_lag_messages as the runtime does. Kafka is
// franz-go's in-process kfake cluster (no Kafka server exists here).
func TestLagGauge(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, ctx context.Context) config.Source
	}{
		{"NATSJetStream", jetStreamWith500},
		{"Kafka", kafkaWith500},
		{"RabbitMQ", rabbitWith500},
		{"RedisStreams", redisWith500},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cfg := &config.Config{Source: tc.setup(t, ctx)}
			g, err := newOpsGauges(prometheus.NewRegistry(), newLoopState(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			// RabbitMQ's management statistics trail the queue by seconds.
			deadline := time.Now().Add(20 * time.Second)
			for {
				g.readLag(ctx, cfg, logr.Discard())
				got := testutil.ToFloat64(g.lag)
				if got == lagPublished {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("idc_source_lag_messages = %v, want %d", got, lagPublished)
				}
				time.Sleep(250 * time.Millisecond)
			}
			// A read that fails keeps the last value.
			cfg.Source = config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: "IDC_NO_SUCH_STREAM", Consumer: "c"}}
			g.readLag(ctx, cfg, logr.Discard())
			if got := testutil.ToFloat64(g.lag); got != lagPublished {
				t.Fatalf("after a failed read idc_source_lag_messages = %v, want the last value %d", got, lagPublished)
			}
		})
	}
}

func jetStreamWith500(t *testing.T, ctx context.Context) config.Source {
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatalf("NATS JetStream at %s is required (make nats; with IDC_TEST_NATS=system, make services): %v", natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("IDC_GAUGE_%d", time.Now().UnixNano())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	if _, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "projector", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for i := range lagPublished {
		if _, err := js.Publish(ctx, strings.ToLower(name)+".orders", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	return config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: name, Consumer: "projector"}}
}

func kafkaWith500(t *testing.T, ctx context.Context) config.Source {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	for i := range lagPublished {
		if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(strconv.Itoa(i)), Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return config.Source{Kafka: &config.Kafka{BootstrapServers: c.ListenAddrs(), Topics: []string{"orders"}, ConsumerGroup: "projector"}}
}

func rabbitWith500(t *testing.T, ctx context.Context) config.Source {
	const uri = "amqp://guest:guest@127.0.0.1:5672/"
	conn, err := amqp.Dial(uri)
	if err != nil {
		t.Fatalf("RabbitMQ is required for this test: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q := fmt.Sprintf("idc-gauge-%d", time.Now().UnixNano())
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(q, false, false, false) })
	for i := range lagPublished {
		if err := ch.PublishWithContext(ctx, "", q, false, false, amqp.Publishing{Body: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("IDC_GAUGE_AMQP_URI", uri)
	return config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: "IDC_GAUGE_AMQP_URI", Queue: q, ManagementURL: "http://127.0.0.1:15672"}}
}

func redisWith500(t *testing.T, ctx context.Context) config.Source {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	t.Cleanup(func() { _ = rdb.Close() })
	stream := fmt.Sprintf("idc-gauge-%d", time.Now().UnixNano())
	t.Cleanup(func() { rdb.Del(context.Background(), stream) })
	if err := rdb.XGroupCreateMkStream(ctx, stream, "projector", "0").Err(); err != nil {
		t.Fatalf("Redis is required for this test: %v", err)
	}
	for i := range lagPublished {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"body": strconv.Itoa(i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return config.Source{RedisStreams: &config.RedisStreams{Address: "127.0.0.1:6379", Stream: stream, Group: "projector"}}
}
