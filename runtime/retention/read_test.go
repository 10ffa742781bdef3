package retention

// Read against the live services (and kfake for Kafka): one call returns
// the window and the lag, and for NATS, RabbitMQ and Redis it dials the
// broker exactly once: every connection goes through a counting dialer.

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// dialCounter counts the connections a Read opens.
type dialCounter struct{ n atomic.Int32 }

func (c *dialCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c.n.Add(1)
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// readCounting is Read through a fresh dial counter.
func readCounting(t *testing.T, cfg *config.Config, getenv Getenv) (Reading, int32, error) {
	t.Helper()
	var c dialCounter
	r, err := read(testCtx(t), cfg, getenv, time.Now(), c.dial, true)
	t.Logf("window=%s lag=%d lagErr=%v err=%v dials=%d", FormatDuration(r.Result.Window), r.Lag, r.LagErr, err, c.n.Load())
	return r, c.n.Load(), err
}

// wantOneDial fails unless the reading has both the window and the lag
// and took exactly one connection.
func wantOneDial(t *testing.T, r Reading, err error, dials int32, window time.Duration, lag int64) {
	t.Helper()
	if err != nil || r.LagErr != nil {
		t.Fatalf("Read: %v, lag error %v", err, r.LagErr)
	}
	if r.Result.Window != window || r.Lag != lag {
		t.Fatalf("Read: window %s lag %d, want %s and %d (derivedFrom: %s)", r.Result.Window, r.Lag, window, lag, r.Result.DerivedFrom)
	}
	if dials != 1 {
		t.Fatalf("Read dialled the broker %d times, want once", dials)
	}
}

func TestReadJetStream(t *testing.T) {
	js := natsJS(t)
	name := strings.ToUpper(unique("IDC_READ"))
	createStream(t, js, jetstream.StreamConfig{Name: name, MaxAge: 48 * time.Hour})
	if _, err := js.CreateConsumer(testCtx(t), name, jetstream.ConsumerConfig{
		Durable: "projector", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: 5, MaxAckPending: 77,
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := js.Publish(testCtx(t), strings.ToLower(name)+".orders", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	cfg := jsConfig(name, "projector", retention(24*time.Hour, time.Hour, 0))
	r, dials, err := readCounting(t, cfg, nil)
	// The window as TestJetStreamLive derives it, the limits read on the way.
	wantOneDial(t, r, err, dials, 49*time.Hour, 20)
	if r.Result.Limits.MaxAckPending != 77 {
		t.Errorf("limits %+v, want MaxAckPending 77", r.Result.Limits)
	}

	// A consumer that does not exist yet: the window from the defaults, the
	// lag alone fails.
	r, dials, err = readCounting(t, jsConfig(name, "not-yet", retention(24*time.Hour, time.Hour, 0)), nil)
	if err != nil || r.Result.Window != 49*time.Hour || !errors.Is(r.LagErr, ErrSourceNotFound) || dials != 1 {
		t.Fatalf("missing consumer: window %s, %v, lag error %v, %d dials; want 49h, the lag alone ErrSourceNotFound, one dial",
			r.Result.Window, err, r.LagErr, dials)
	}
}

func TestReadExplicitReadsOnlyTheLag(t *testing.T) {
	js := natsJS(t)
	name := strings.ToUpper(unique("IDC_READ_EX"))
	createStream(t, js, jetstream.StreamConfig{Name: name})
	if _, err := js.CreateConsumer(testCtx(t), name, jetstream.ConsumerConfig{Durable: "projector", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := js.Publish(testCtx(t), strings.ToLower(name)+".orders", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	explicit := config.Retention{Mode: ModeExplicit, Window: config.Duration{Duration: 168 * time.Hour}}
	r, dials, err := readCounting(t, jsConfig(name, "projector", explicit), nil)
	wantOneDial(t, r, err, dials, 168*time.Hour, 3)
	if r.Result.Source != SourceDeclared {
		t.Errorf("source %s, want Declared", r.Result.Source)
	}

	// The broker down: the window still comes from the spec, the lag fails
	// without failing Read, and the error shows no credential.
	down := baseConfig(config.Source{NATSJetStream: &config.JetStream{URL: "nats://idc:s3cret-pw@127.0.0.1:1", Stream: name, Consumer: "projector"}}, explicit)
	r, _, err = readCounting(t, down, nil)
	if err != nil || r.Result.Window != 168*time.Hour || !errors.Is(r.LagErr, ErrBrokerUnreachable) {
		t.Fatalf("explicit, broker down: window %s, %v, lag error %v; want 168h, no error, ErrBrokerUnreachable", r.Result.Window, err, r.LagErr)
	}
	if strings.Contains(r.LagErr.Error(), "s3cret-pw") {
		t.Fatalf("lag error leaks a credential: %v", r.LagErr)
	}
}

func TestReadErrors(t *testing.T) {
	// Unreachable in Derived mode: Derive's error, and no lag.
	cfg := baseConfig(config.Source{NATSJetStream: &config.JetStream{URL: "nats://idc:s3cret-pw@127.0.0.1:1", Stream: "S", Consumer: "c"}},
		retention(time.Hour, time.Hour, 0))
	r, _, err := readCounting(t, cfg, nil)
	if !errors.Is(err, ErrBrokerUnreachable) || r.LagErr == nil || strings.Contains(err.Error(), "s3cret-pw") {
		t.Fatalf("unreachable: %v (lag error %v); want ErrBrokerUnreachable without the password, and no lag", err, r.LagErr)
	}
	// An invalid spec fails before any broker call.
	cfg.Retention.SafetyMargin.Duration = -time.Second
	if _, dials, err := readCounting(t, cfg, nil); !errors.Is(err, ErrInvalidSpec) || dials != 0 {
		t.Fatalf("invalid spec: %v after %d dials, want ErrInvalidSpec and none", err, dials)
	}
}

func TestReadRedisStreams(t *testing.T) {
	rdb := redisClient(t)
	stream := unique("idc-read")
	t.Cleanup(func() { rdb.Del(testCtx(t), stream) })
	if err := rdb.XGroupCreateMkStream(testCtx(t), stream, "projector", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		if err := rdb.XAdd(testCtx(t), &redis.XAddArgs{Stream: stream, Values: map[string]any{"body": strconv.Itoa(i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Without maxReplayAge: ErrUnboundedReplay, the Result still filled in
	// and the lag still read.
	r, dials, err := readCounting(t, redisCfg(stream, retention(24*time.Hour, time.Hour, 0)), nil)
	if !errors.Is(err, ErrUnboundedReplay) || r.Result.DerivedFrom == "" || r.LagErr != nil || r.Lag != 30 || dials != 1 {
		t.Fatalf("unbounded: %v, derivedFrom %q, lag %d (%v), %d dials; want ErrUnboundedReplay with the inputs, lag 30, one dial",
			err, r.Result.DerivedFrom, r.Lag, r.LagErr, dials)
	}
	r, dials, err = readCounting(t, redisCfg(stream, retention(24*time.Hour, time.Hour, 720*time.Hour)), nil)
	wantOneDial(t, r, err, dials, 721*time.Hour, 30)
}

func TestReadRabbitMQ(t *testing.T) {
	ch := amqpChannel(t)
	q := declareQueue(t, ch, amqp.Table{"x-message-ttl": int32(3600000)})
	for i := range 12 {
		if err := ch.PublishWithContext(testCtx(t), "", q, false, false, amqp.Publishing{Body: []byte(strconv.Itoa(i))}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rabbitCfg(q, retention(24*time.Hour, time.Hour, 0))
	// The management statistics trail the queue by a few seconds.
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, dials, err := readCounting(t, cfg, rabbitEnv)
		if err == nil && r.Lag == 12 || time.Now().After(deadline) {
			// L = 1h, classic: W = 1h + 1h, as TestRabbitMQLiveClassicTTL.
			wantOneDial(t, r, err, dials, 2*time.Hour, 12)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func TestReadKafka(t *testing.T) {
	c, adm := kfakeCluster(t)
	topic := unique("orders")
	createTopic(t, adm, topic, map[string]string{"retention.ms": "172800000", "segment.ms": "3600000"})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	for i := range 10 {
		if err := cl.ProduceSync(testCtx(t), &kgo.Record{Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// One franz-go client serves both; it opens a connection per broker and
	// request kind, so the dials are not counted here.
	r, _, err := readCounting(t, kafkaCfg(c, retention(24*time.Hour, time.Hour, 0), topic), nil)
	if err != nil || r.LagErr != nil || r.Result.Window != 50*time.Hour || r.Lag != 10 {
		t.Fatalf("Read: window %s lag %d (%v), %v; want 50h and 10", r.Result.Window, r.Lag, r.LagErr, err)
	}
}
