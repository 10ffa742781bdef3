package retention

// There is no Kafka server on this machine: these tests run against
// franz-go's in-process kfake cluster (github.com/twmb/franz-go/pkg/kfake),
// which speaks the Kafka protocol over loopback, including DescribeConfigs,
// CreateTopics with configs and IncrementalAlterConfigs.

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

func kfakeCluster(t *testing.T, opts ...kfake.Opt) (*kfake.Cluster, *kadm.Client) {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return c, kadm.NewClient(cl)
}

func createTopic(t *testing.T, adm *kadm.Client, topic string, configs map[string]string) {
	t.Helper()
	cfg := map[string]*string{}
	for k, v := range configs {
		cfg[k] = &v
	}
	resp, err := adm.CreateTopic(testCtx(t), 1, 1, cfg, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("creating topic %s: %v", topic, err)
	}
}

func alterTopic(t *testing.T, adm *kadm.Client, topic, key, value string) {
	t.Helper()
	resps, err := adm.AlterTopicConfigs(testCtx(t), []kadm.AlterConfig{{Op: kadm.SetConfig, Name: key, Value: &value}}, topic)
	if err == nil {
		_, err = resps.On(topic, nil)
	}
	if err == nil {
		err = resps[0].Err
	}
	if err != nil {
		t.Fatalf("setting %s=%s on %s: %v", key, value, topic, err)
	}
}

func kafkaCfg(c *kfake.Cluster, r config.Retention, topics ...string) *config.Config {
	return baseConfig(config.Source{Kafka: &config.Kafka{BootstrapServers: c.ListenAddrs(), Topics: topics, ConsumerGroup: "projector"}}, r)
}

func TestKafkaLive(t *testing.T) {
	c, adm := kfakeCluster(t)
	topic := unique("orders")
	createTopic(t, adm, topic, map[string]string{"retention.ms": "172800000", "segment.ms": "3600000"})
	cfg := kafkaCfg(c, retention(24*time.Hour, time.Hour, 0), topic)

	// L = 48h, A = ∞ → R_redeliver = 48h; R_replay = 48h + 1h.
	res := mustDerive(t, cfg, nil)
	wantWindow(t, res, 50*time.Hour,
		"topic "+topic+" retention.ms=172800000 (48h, topic config) segment.ms=3600000 (1h, topic config) cleanup.policy=delete",
		"consumer group projector commits offsets only after processing",
		"broker offsets.retention.minutes=10080 (168h")
	if res.RedeliveryHorizon.String() != "48h" || res.ReplayHorizon.String() != "49h" {
		t.Fatalf("horizons %s / %s", res.RedeliveryHorizon, res.ReplayHorizon)
	}

	// retention.ms changes to 24h: Derive follows.
	alterTopic(t, adm, topic, "retention.ms", "86400000")
	res2 := mustDerive(t, cfg, nil)
	wantWindow(t, res2, 26*time.Hour, "retention.ms=86400000 (24h, topic config)")
	if res2.InputsHash == res.InputsHash {
		t.Error("inputs changed but the hash did not")
	}

	// retention.ms=-1: unbounded.
	alterTopic(t, adm, topic, "retention.ms", "-1")
	if _, err := Derive(testCtx(t), cfg, nil, time.Now()); !errors.Is(err, ErrUnboundedReplay) {
		t.Fatalf("retention.ms=-1: want ErrUnboundedReplay, got %v", err)
	}
}

func TestKafkaLiveCompactedAndSeveralTopics(t *testing.T) {
	c, adm := kfakeCluster(t, kfake.BrokerConfigs(map[string]string{"offsets.retention.minutes": "60"}))
	compacted, plain := unique("state"), unique("events")
	createTopic(t, adm, compacted, map[string]string{"cleanup.policy": "compact"})
	createTopic(t, adm, plain, map[string]string{"retention.ms": "3600000", "segment.ms": "600000"})

	cfg := kafkaCfg(c, retention(24*time.Hour, time.Hour, 0), compacted, plain)
	_, err := Derive(testCtx(t), cfg, nil, time.Now())
	if !errors.Is(err, ErrUnboundedReplay) || !strings.Contains(err.Error(), "cleanup.policy=compact") {
		t.Fatalf("compacted topic: want ErrUnboundedReplay naming the topic, got %v", err)
	}
	cfg.Retention.MaxReplayAge.Duration = 720 * time.Hour
	res := mustDerive(t, cfg, nil)
	wantWindow(t, res, 721*time.Hour, "offsets.retention.minutes=60 (1h", "shorter than maxConsumerOutage")
	if res.Source != SourceDeclared {
		t.Errorf("source %s", res.Source)
	}

	// Only the plain topic: L = 1h, R_replay = 1h10m.
	wantWindow(t, mustDerive(t, kafkaCfg(c, retention(24*time.Hour, time.Hour, 0), plain), nil), 2*time.Hour+10*time.Minute)
}

func TestKafkaLiveErrors(t *testing.T) {
	c, _ := kfakeCluster(t)
	_, err := Derive(testCtx(t), kafkaCfg(c, retention(time.Hour, time.Hour, 0), unique("missing")), nil, time.Now())
	if !errors.Is(err, ErrSourceNotFound) {
		t.Fatalf("missing topic: want ErrSourceNotFound, got %v", err)
	}
	cfg := baseConfig(config.Source{Kafka: &config.Kafka{BootstrapServers: []string{"127.0.0.1:1"}, Topics: []string{"t"}, ConsumerGroup: "g",
		SASL: &config.SASL{Mechanism: "PLAIN", UsernameEnv: "U", PasswordEnv: "P"}}}, retention(time.Hour, time.Hour, 0))
	wantUnreachable(t, cfg, envMap(map[string]string{"U": "idc", "P": "s3cret-pw"}), "s3cret-pw")
}
