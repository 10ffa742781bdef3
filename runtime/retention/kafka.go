package retention

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// Kafka's documented topic defaults, used only when a broker does not
// report a value.
const (
	kafkaDefaultRetentionMs = int64(7 * 24 * time.Hour / time.Millisecond)
	kafkaDefaultSegmentMs   = int64(7 * 24 * time.Hour / time.Millisecond)
)

type kafkaInspector struct {
	cfg    *config.Kafka
	getenv Getenv
	dial   brokerconn.Dialer
	// outage is maxConsumerOutage, compared with offsets.retention.minutes.
	outage time.Duration
}

// kafkaSession is one franz-go client.
type kafkaSession struct {
	*kafkaInspector
	cl  *kgo.Client
	adm *kadm.Client
}

func (k *kafkaInspector) open(context.Context) (session, error) {
	opts, err := brokerconn.KafkaOptions(k.cfg.BootstrapServers, k.cfg.SASL, k.cfg.TLS, k.getenv,
		brokerconn.Kafka{ClientID: "idc-retention", DialTimeout: 5 * time.Second, Dial: k.dial})
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("while creating the Kafka client: %w", err)
	}
	return &kafkaSession{kafkaInspector: k, cl: cl, adm: kadm.NewClient(cl)}, nil
}

func (k *kafkaSession) close() { k.cl.Close() }

// inspect reads retention.ms, segment.ms and cleanup.policy of every topic
// and, for information, the broker's offsets.retention.minutes.
func (k *kafkaSession) inspect(ctx context.Context) (Observation, error) {
	rcs, err := k.adm.DescribeTopicConfigs(ctx, k.cfg.Topics...)
	if err != nil {
		return Observation{}, kafkaRequestError("reading the configs of topics "+strings.Join(k.cfg.Topics, ","), err)
	}
	obs, err := kafkaObservation(rcs)
	if err != nil {
		return Observation{}, err
	}
	obs.Facts = append(obs.Facts, fmt.Sprintf("consumer group %s commits offsets only after processing, so uncommitted records are redelivered while they are retained: A=∞, R_redeliver=L", k.cfg.ConsumerGroup))
	obs.Info = append(obs.Info, k.offsetsRetention(ctx))
	return obs, nil
}

// kafkaRequestError: a Kafka error code (authorization, …) is an answer; any
// other failure means no broker answered.
func kafkaRequestError(what string, err error) error {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return fmt.Errorf("while %s: %w", what, err)
	}
	return unreachable(what, err)
}

// kafkaObservation: L is the longest retention.ms of the topics, R_replay
// the longest retention.ms + segment.ms (a record lives until its whole
// segment is rolled and expires); a topic that only compacts, or has
// retention.ms=-1, keeps records forever (∞).
func kafkaObservation(rcs kadm.ResourceConfigs) (Observation, error) {
	slices.SortFunc(rcs, func(a, b kadm.ResourceConfig) int { return strings.Compare(a.Name, b.Name) })
	obs := Observation{}
	for _, rc := range rcs {
		if rc.Err != nil {
			return Observation{}, kafkaTopicError(rc)
		}
		t := parseKafkaTopic(rc)
		obs.Life = MaxHorizon(obs.Life, t.life())
		obs.Replay = MaxHorizon(obs.Replay, t.replay())
		obs.Facts = append(obs.Facts, t.String())
	}
	return obs, nil
}

func kafkaTopicError(rc kadm.ResourceConfig) error {
	if errors.Is(rc.Err, kerr.UnknownTopicOrPartition) {
		return fmt.Errorf("%w: Kafka topic %s: %w", ErrSourceNotFound, rc.Name, rc.Err)
	}
	return fmt.Errorf("while reading the configs of Kafka topic %s: %w", rc.Name, rc.Err)
}

// kafkaValue is one config value and where the broker says it comes from.
type kafkaValue struct {
	raw    string
	origin string
}

type kafkaTopic struct {
	name                              string
	retention, segment, cleanupPolicy kafkaValue
	retentionMs, segmentMs            int64
	compactOnly                       bool
}

func parseKafkaTopic(rc kadm.ResourceConfig) kafkaTopic {
	t := kafkaTopic{
		name:          rc.Name,
		retention:     kafkaConfig(rc, "retention.ms", strconv.FormatInt(kafkaDefaultRetentionMs, 10)),
		segment:       kafkaConfig(rc, "segment.ms", strconv.FormatInt(kafkaDefaultSegmentMs, 10)),
		cleanupPolicy: kafkaConfig(rc, "cleanup.policy", "delete"),
	}
	t.retentionMs = parseKafkaMs(t.retention.raw)
	t.segmentMs = parseKafkaMs(t.segment.raw)
	policies := strings.Split(strings.ReplaceAll(t.cleanupPolicy.raw, " ", ""), ",")
	t.compactOnly = slices.Contains(policies, "compact") && !slices.Contains(policies, "delete")
	return t
}

func kafkaConfig(rc kadm.ResourceConfig, key, def string) kafkaValue {
	for _, c := range rc.Configs {
		if c.Key == key && c.Value != nil {
			return kafkaValue{raw: *c.Value, origin: kafkaOrigin(c.Source)}
		}
	}
	return kafkaValue{raw: def, origin: "not reported, Kafka default"}
}

func kafkaOrigin(s kmsg.ConfigSource) string {
	switch s {
	case kmsg.ConfigSourceDynamicTopicConfig:
		return "topic config"
	case kmsg.ConfigSourceDynamicBrokerConfig, kmsg.ConfigSourceDynamicDefaultBrokerConfig, kmsg.ConfigSourceStaticBrokerConfig:
		return "broker config"
	case kmsg.ConfigSourceDefaultConfig:
		return "broker default"
	}
	return strings.ToLower(s.String())
}

// parseKafkaMs reads a millisecond value. An unparsable one counts as -1
// (unbounded): guessing a bound could shrink the window below the truth.
func parseKafkaMs(raw string) int64 {
	v, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
	if err != nil {
		return -1
	}
	return v
}

func (t kafkaTopic) life() Horizon {
	if t.compactOnly || t.retentionMs < 0 {
		return Infinite()
	}
	return Finite(time.Duration(t.retentionMs) * time.Millisecond)
}

func (t kafkaTopic) replay() Horizon {
	if t.segmentMs < 0 {
		return Infinite()
	}
	return t.life().Add(time.Duration(t.segmentMs) * time.Millisecond)
}

func (t kafkaTopic) String() string {
	return fmt.Sprintf("topic %s retention.ms=%s (%s, %s) segment.ms=%s (%s, %s) cleanup.policy=%s (%s)",
		t.name, t.retention.raw, msHuman(t.retentionMs), t.retention.origin,
		t.segment.raw, msHuman(t.segmentMs), t.segment.origin,
		t.cleanupPolicy.raw, t.cleanupPolicy.origin)
}

func msHuman(ms int64) string {
	if ms < 0 {
		return "unlimited"
	}
	return FormatDuration(time.Duration(ms) * time.Millisecond)
}

// offsetsRetention describes the broker's offsets.retention.minutes. It is
// informational: once committed offsets expire during an outage the group
// restarts at the earliest offset, a replay that R_replay already covers.
func (k *kafkaSession) offsetsRetention(ctx context.Context) string {
	rcs, err := k.adm.DescribeBrokerConfigs(ctx)
	if err == nil && len(rcs) > 0 && rcs[0].Err != nil {
		err = rcs[0].Err
	}
	if err != nil {
		return fmt.Sprintf("broker offsets.retention.minutes unknown (%v; informational)", err)
	}
	v := kafkaConfig(rcs[0], "offsets.retention.minutes", "10080")
	minutes, perr := strconv.ParseInt(strings.TrimSpace(v.raw), 10, 64)
	if perr != nil {
		return fmt.Sprintf("broker offsets.retention.minutes=%s (%s; informational)", v.raw, v.origin)
	}
	d := time.Duration(minutes) * time.Minute
	note := "informational: committed offsets outlive an idle group that long, then it restarts at the earliest offset, a replay R_replay covers"
	if d < k.outage {
		note = "shorter than maxConsumerOutage: " + note
	}
	return fmt.Sprintf("broker offsets.retention.minutes=%d (%s, %s; %s)", minutes, FormatDuration(d), v.origin, note)
}
