package retention

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const (
	h   = time.Hour
	day = 24 * time.Hour
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func spec(maxReplayAge time.Duration) Spec {
	return Spec{Mode: ModeDerived, MaxConsumerOutage: 24 * h, SafetyMargin: h, MaxReplayAge: maxReplayAge}
}

func js(maxAge time.Duration, ret jetstream.RetentionPolicy, maxDeliver int, backoff ...time.Duration) Observation {
	cc := jetstream.ConsumerConfig{AckWait: 30 * time.Second, MaxDeliver: maxDeliver, BackOff: backoff}
	return jetStreamObservation("ORDERS", jetstream.StreamConfig{MaxAge: maxAge, Retention: ret}, cc,
		"consumer orders-projector ack_wait=30s max_deliver=5 backoff=[] (broker)")
}

func kafkaTopicCfg(name string, kv ...string) kadm.ResourceConfig {
	rc := kadm.ResourceConfig{Name: name}
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		rc.Configs = append(rc.Configs, kadm.Config{Key: kv[i], Value: &v, Source: kmsg.ConfigSourceDynamicTopicConfig})
	}
	return rc
}

func kafka(t *testing.T, rcs ...kadm.ResourceConfig) Observation {
	t.Helper()
	obs, err := kafkaObservation(rcs)
	if err != nil {
		t.Fatal(err)
	}
	return obs
}

func rabbitTTL(ttl time.Duration) rabbitSettings {
	s := rabbitSettings{consumerTimeout: rabbitValue[time.Duration]{v: 30 * time.Minute, origin: "broker default", set: true}}
	if ttl > 0 {
		s.ttl = rabbitValue[time.Duration]{v: ttl, origin: "queue argument x-message-ttl", set: true}
	}
	return s
}

func TestCompute(t *testing.T) {
	redisCfg := &config.RedisStreams{Stream: "orders", Group: "projector", ClaimMinIdle: config.Duration{Duration: 30 * time.Second}}
	quorum := rabbitTTL(0)
	quorum.deliveryLimit = rabbitValue[int64]{v: 4, origin: "queue argument x-delivery-limit", set: true}
	stream := rabbitSettings{maxAge: rabbitValue[time.Duration]{v: 7 * day, origin: "queue argument x-max-age", set: true}, maxAgeRaw: "7D"}
	cases := []struct {
		name             string
		spec             Spec
		obs              Observation
		window           time.Duration
		redeliver        string
		replay           string
		source           SourceKind
		unbounded        bool
		derivedFromParts []string
	}{
		{name: "jetstream limits MaxAge=48h ack_wait=30s max_deliver=5", spec: spec(0), obs: js(48*h, jetstream.LimitsPolicy, 5),
			window: 49 * h, redeliver: "24h2m30s", replay: "48h", source: SourceBroker,
			derivedFromParts: []string{"stream ORDERS max_age=48h retention=limits (broker)", "consumer orders-projector ack_wait=30s max_deliver=5 backoff=[] (broker)",
				"maxConsumerOutage=24h (spec)", "safetyMargin=1h (spec)", "maxReplayAge unset (spec)", "A=2m30s"}},
		{name: "jetstream MaxAge shorter than A+O", spec: spec(0), obs: js(12*h, jetstream.LimitsPolicy, 5),
			window: 13 * h, redeliver: "12h", replay: "12h", source: SourceBroker},
		{name: "jetstream MaxAge=0 limits, no maxReplayAge", spec: spec(0), obs: js(0, jetstream.LimitsPolicy, 5),
			unbounded: true, redeliver: "24h2m30s", replay: "∞", derivedFromParts: []string{"max_age=0 (unlimited)"}},
		{name: "jetstream MaxAge=0 limits, maxReplayAge=720h", spec: spec(720 * h), obs: js(0, jetstream.LimitsPolicy, 5),
			window: 721 * h, redeliver: "24h2m30s", replay: "720h", source: SourceDeclared,
			derivedFromParts: []string{"maxReplayAge=720h (spec)", "R_replay=∞ bounded by maxReplayAge"}},
		{name: "jetstream workqueue MaxAge=0: no replay", spec: spec(0), obs: js(0, jetstream.WorkQueuePolicy, 5),
			window: 25*h + 2*time.Minute + 30*time.Second, redeliver: "24h2m30s", replay: "0s", source: SourceBroker},
		{name: "jetstream interest retention: no replay", spec: spec(0), obs: js(6*h, jetstream.InterestPolicy, 5),
			window: 7 * h, redeliver: "6h", replay: "0s", source: SourceBroker},
		{name: "jetstream unbounded attempts, MaxAge bounds", spec: spec(0), obs: js(48*h, jetstream.LimitsPolicy, -1),
			window: 49 * h, redeliver: "48h", replay: "48h", source: SourceBroker, derivedFromParts: []string{"A=∞"}},
		{name: "jetstream workqueue unbounded attempts and no MaxAge", spec: spec(0), obs: js(0, jetstream.WorkQueuePolicy, -1),
			unbounded: true, redeliver: "∞", replay: "0s", derivedFromParts: []string{"L=∞ A=∞"}},
		{name: "jetstream workqueue unbounded attempts, maxReplayAge bounds redelivery", spec: spec(100 * h), obs: js(0, jetstream.WorkQueuePolicy, -1),
			window: 101 * h, redeliver: "100h", replay: "0s", source: SourceDeclared, derivedFromParts: []string{"R_redeliver=∞ bounded by maxReplayAge"}},
		{name: "jetstream backoff array, last value repeats", spec: Spec{}, obs: js(h, jetstream.WorkQueuePolicy, 5, time.Second, 5*time.Second, 30*time.Second),
			window: 96 * time.Second, redeliver: "1m36s", replay: "0s", source: SourceBroker},
		{name: "leases and backoffs", spec: Spec{}, obs: Observation{Life: Infinite(), Attempts: Attempts{Max: 3, Leases: []time.Duration{10 * time.Second}, Backoffs: []time.Duration{time.Second, 2 * time.Second}}},
			window: 35 * time.Second, redeliver: "35s", replay: "0s", source: SourceBroker},
		{name: "huge max_deliver overflows to unbounded A, L bounds", spec: spec(0), obs: js(48*h, jetstream.WorkQueuePolicy, 1<<40),
			window: 49 * h, redeliver: "48h", replay: "0s", source: SourceBroker},
		{name: "kafka retention.ms=48h segment.ms=1h", spec: spec(0),
			obs:    kafka(t, kafkaTopicCfg("orders", "retention.ms", "172800000", "segment.ms", "3600000", "cleanup.policy", "delete")),
			window: 50 * h, redeliver: "48h", replay: "49h", source: SourceBroker,
			derivedFromParts: []string{"topic orders retention.ms=172800000 (48h, topic config) segment.ms=3600000 (1h, topic config) cleanup.policy=delete (topic config)"}},
		{name: "kafka several topics: the longest decides", spec: spec(0),
			obs: kafka(t, kafkaTopicCfg("b", "retention.ms", "3600000", "segment.ms", "3600000", "cleanup.policy", "delete"),
				kafkaTopicCfg("a", "retention.ms", "7200000", "segment.ms", "60000", "cleanup.policy", "delete")),
			window: 3*h + time.Minute, redeliver: "2h", replay: "2h1m", source: SourceBroker},
		{name: "kafka compacted", spec: spec(0), obs: kafka(t, kafkaTopicCfg("orders", "retention.ms", "172800000", "segment.ms", "3600000", "cleanup.policy", "compact")),
			unbounded: true, redeliver: "∞", replay: "∞"},
		{name: "kafka compact,delete is bounded by retention.ms", spec: spec(0), obs: kafka(t, kafkaTopicCfg("orders", "retention.ms", "3600000", "segment.ms", "3600000", "cleanup.policy", "compact,delete")),
			window: 3 * h, redeliver: "1h", replay: "2h", source: SourceBroker},
		{name: "kafka compacted with maxReplayAge", spec: spec(720 * h), obs: kafka(t, kafkaTopicCfg("orders", "cleanup.policy", "compact")),
			window: 721 * h, redeliver: "720h", replay: "720h", source: SourceDeclared},
		{name: "kafka retention.ms=-1", spec: spec(0), obs: kafka(t, kafkaTopicCfg("orders", "retention.ms", "-1", "segment.ms", "3600000", "cleanup.policy", "delete")),
			unbounded: true, redeliver: "∞", replay: "∞", derivedFromParts: []string{"retention.ms=-1 (unlimited, topic config)"}},
		{name: "kafka configs not reported: Kafka defaults", spec: spec(0), obs: kafka(t, kafkaTopicCfg("orders")),
			window: 337 * h, redeliver: "168h", replay: "336h", source: SourceBroker, derivedFromParts: []string{"not reported, Kafka default"}},
		{name: "rabbitmq classic without TTL", spec: spec(0), obs: rabbitObservation(rabbitQueue{Name: "orders", Vhost: "/", Type: "classic"}, rabbitTTL(0)),
			unbounded: true, redeliver: "∞", replay: "0s", derivedFromParts: []string{"no message-ttl", "attempts unbounded"}},
		{name: "rabbitmq classic without TTL, maxReplayAge", spec: spec(72 * h), obs: rabbitObservation(rabbitQueue{Name: "orders", Vhost: "/", Type: "classic"}, rabbitTTL(0)),
			window: 73 * h, redeliver: "72h", replay: "0s", source: SourceDeclared},
		{name: "rabbitmq classic with TTL 1h", spec: spec(0), obs: rabbitObservation(rabbitQueue{Name: "orders", Vhost: "/", Type: "classic"}, rabbitTTL(h)),
			window: 2 * h, redeliver: "1h", replay: "0s", source: SourceBroker, derivedFromParts: []string{"message-ttl=1h (queue argument x-message-ttl)"}},
		{name: "rabbitmq quorum delivery-limit 4 × consumer_timeout 30m", spec: spec(0), obs: rabbitObservation(rabbitQueue{Name: "orders", Vhost: "/", Type: "quorum"}, quorum),
			window: 27*h + 30*time.Minute, redeliver: "26h30m", replay: "0s", source: SourceBroker, derivedFromParts: []string{"at most 5 deliveries", "consumer_timeout=30m"}},
		{name: "rabbitmq stream max-age 7D", spec: spec(0), obs: rabbitObservation(rabbitQueue{Name: "orders", Vhost: "/", Type: "stream"}, stream),
			window: 169 * h, redeliver: "168h", replay: "168h", source: SourceBroker},
		{name: "rabbitmq stream without max-age", spec: spec(0), obs: rabbitObservation(rabbitQueue{Name: "orders", Vhost: "/", Type: "stream"}, rabbitSettings{}),
			unbounded: true, redeliver: "∞", replay: "∞"},
		{name: "redis without maxReplayAge", spec: spec(0), obs: redisObservation(redisCfg, "stream orders is empty"),
			unbounded: true, redeliver: "∞", replay: "∞", derivedFromParts: []string{"claimMinIdle=30s", "stream orders is empty"}},
		{name: "redis with maxReplayAge", spec: spec(720 * h), obs: redisObservation(redisCfg, "stream orders is empty"),
			window: 721 * h, redeliver: "720h", replay: "720h", source: SourceDeclared},
		{name: "explicit", spec: Spec{Mode: ModeExplicit, Window: 168 * h, SafetyMargin: h}, obs: js(48*h, jetstream.LimitsPolicy, 5),
			window: 168 * h, redeliver: "0s", replay: "0s", source: SourceDeclared, derivedFromParts: []string{"mode=Explicit (spec)", "window=168h (spec)", "broker not read"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := Compute(c.spec, c.obs, t0)
			checkUnbounded(t, c.unbounded, res, err)
			if res.Window != c.window || res.RedeliveryHorizon.String() != c.redeliver || res.ReplayHorizon.String() != c.replay {
				t.Errorf("got W=%s R_redeliver=%s R_replay=%s, want W=%s R_redeliver=%s R_replay=%s (%s)",
					res.Window, res.RedeliveryHorizon, res.ReplayHorizon, c.window, c.redeliver, c.replay, res.DerivedFrom)
			}
			if !c.unbounded && res.Source != c.source {
				t.Errorf("source %s, want %s", res.Source, c.source)
			}
			for _, p := range c.derivedFromParts {
				if !strings.Contains(res.DerivedFrom, p) {
					t.Errorf("DerivedFrom %q lacks %q", res.DerivedFrom, p)
				}
			}
			if len(res.InputsHash) != 16 || !res.ObservedAt.Equal(t0) {
				t.Errorf("hash %q observedAt %s", res.InputsHash, res.ObservedAt)
			}
		})
	}
}

func checkUnbounded(t *testing.T, unbounded bool, res Result, err error) {
	t.Helper()
	switch {
	case !unbounded && err != nil:
		t.Fatal(err)
	case !unbounded:
	case !errors.Is(err, ErrUnboundedReplay) || !strings.Contains(err.Error(), "maxReplayAge"):
		t.Fatalf("want ErrUnboundedReplay naming maxReplayAge, got %v", err)
	case res.Window != 0:
		t.Errorf("window %s with an error", res.Window)
	}
}

func TestComputeUnboundedRedeliveryMessage(t *testing.T) {
	_, err := Compute(spec(0), js(0, jetstream.WorkQueuePolicy, -1), t0)
	if !errors.Is(err, ErrUnboundedReplay) || !strings.Contains(err.Error(), "redelivery is unbounded") ||
		!strings.Contains(err.Error(), "stream ORDERS max_age=0 (unlimited) retention=workqueue") {
		t.Fatalf("error does not explain the unbounded redelivery: %v", err)
	}
}

func TestComputeInvalidSpec(t *testing.T) {
	for name, s := range map[string]Spec{
		"explicit without window": {Mode: ModeExplicit},
		"negative outage":         {MaxConsumerOutage: -h},
		"negative margin":         {SafetyMargin: -h},
		"unknown mode":            {Mode: "Guess"},
	} {
		if _, err := Compute(s, js(h, jetstream.LimitsPolicy, 5), t0); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%s: want ErrInvalidSpec, got %v", name, err)
		}
	}
}

func TestInputsHash(t *testing.T) {
	hash := func(s Spec, o Observation) string {
		t.Helper()
		r, err := Compute(s, o, t0)
		if err != nil {
			t.Fatal(err)
		}
		return r.InputsHash
	}
	base := hash(spec(0), js(48*h, jetstream.LimitsPolicy, 5))
	if again := hash(spec(0), js(48*h, jetstream.LimitsPolicy, 5)); again != base {
		t.Errorf("same inputs, different hash: %s %s", base, again)
	}
	if other := hash(spec(0), js(47*h, jetstream.LimitsPolicy, 5)); other == base {
		t.Error("MaxAge changed but the hash did not")
	}
	s := spec(0)
	s.SafetyMargin = 2 * h
	if other := hash(s, js(48*h, jetstream.LimitsPolicy, 5)); other == base {
		t.Error("safetyMargin changed but the hash did not")
	}
	redisCfg := &config.RedisStreams{Stream: "s", Group: "g"}
	a := hash(spec(h), redisObservation(redisCfg, "first entry age=1h"))
	b := hash(spec(h), redisObservation(redisCfg, "first entry age=2h"))
	if a != b {
		t.Error("informational observations changed the hash")
	}
}

func TestAttemptsBound(t *testing.T) {
	cases := []struct {
		a    Attempts
		want string
	}{
		{Attempts{}, "∞"},
		{Attempts{Max: -1, Leases: []time.Duration{time.Second}}, "∞"},
		{Attempts{Max: 5, Leases: []time.Duration{30 * time.Second}}, "2m30s"},
		{Attempts{Max: 2, Leases: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}}, "6s"},
		{Attempts{Max: 4, Leases: []time.Duration{time.Second, 5 * time.Second}}, "16s"},
		{Attempts{Max: 1 << 40, Leases: []time.Duration{time.Hour}}, "∞"},
	}
	for _, c := range cases {
		if got := c.a.Bound().String(); got != c.want {
			t.Errorf("%+v: got %s, want %s", c.a, got, c.want)
		}
	}
}

func TestParseRabbitMaxAge(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"7D": 7 * day, "1h": h, "30m": 30 * time.Minute, "1Y": 365 * day, "1M": 30 * day, "10s": 10 * time.Second,
	} {
		got, err := ParseRabbitMaxAge(in)
		if err != nil || got != want {
			t.Errorf("%q: got %s, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "7", "D", "0D", "-1D", "7d", "1.5h", "7DD", "99999999999Y"} {
		if _, err := ParseRabbitMaxAge(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 192 * h: "192h", 24*h + 30*time.Minute: "24h30m", 90 * time.Second: "1m30s", 30 * time.Minute: "30m",
		h + time.Second: "1h0m1s", 1500 * time.Millisecond: "1.5s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("%d: got %s, want %s", d, got, want)
		}
	}
}
