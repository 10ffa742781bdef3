package retention

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// natsURL is the NATS JetStream server of the run (TestMain): the built
// nats-server 2.15.3 the package starts itself, or with IDC_TEST_NATS=system
// the machine's (Debian's 2.9.10 on 127.0.0.1:4222).
var natsURL string

func natsJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatalf("NATS is not reachable at %s (make nats; with IDC_TEST_NATS=system, make services): %v", natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func createStream(t *testing.T, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	cfg.Subjects = []string{strings.ToLower(cfg.Name) + ".>"}
	s, err := js.CreateStream(testCtx(t), cfg)
	if err != nil {
		t.Fatalf("creating stream %s: %v", cfg.Name, err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(testCtx(t), cfg.Name) })
	return s
}

func jsConfig(stream, consumer string, r config.Retention) *config.Config {
	return baseConfig(config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: stream, Consumer: consumer}}, r)
}

func TestJetStreamLive(t *testing.T) {
	js := natsJS(t)
	name := strings.ToUpper(unique("IDC_RET"))
	createStream(t, js, jetstream.StreamConfig{Name: name, MaxAge: 48 * time.Hour, Retention: jetstream.LimitsPolicy})
	if _, err := js.CreateConsumer(testCtx(t), name, jetstream.ConsumerConfig{
		Durable: "projector", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: 5,
	}); err != nil {
		t.Fatal(err)
	}
	cfg := jsConfig(name, "projector", retention(24*time.Hour, time.Hour, 0))

	// R_redeliver = min(48h, 5×30s + 24h) = 24h2m30s; R_replay = 48h.
	res := mustDerive(t, cfg, nil)
	wantWindow(t, res, 49*time.Hour,
		"stream "+name+" max_age=48h retention=limits (broker)",
		"consumer projector ack_wait=30s max_deliver=5 backoff=[] (broker)",
		"maxConsumerOutage=24h (spec)", "safetyMargin=1h (spec)")
	if res.RedeliveryHorizon.String() != "24h2m30s" || res.ReplayHorizon.String() != "48h" || res.Source != SourceBroker {
		t.Fatalf("horizons %s / %s source %s", res.RedeliveryHorizon, res.ReplayHorizon, res.Source)
	}

	// The stream's MaxAge shrinks to 12h: Derive follows.
	if _, err := js.UpdateStream(testCtx(t), jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"},
		MaxAge: 12 * time.Hour, Retention: jetstream.LimitsPolicy}); err != nil {
		t.Fatal(err)
	}
	res2 := mustDerive(t, cfg, nil)
	wantWindow(t, res2, 13*time.Hour, "max_age=12h")
	if res2.InputsHash == res.InputsHash {
		t.Error("inputs changed but the hash did not")
	}

	// MaxAge=0: replay unbounded without maxReplayAge.
	if _, err := js.UpdateStream(testCtx(t), jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"},
		Retention: jetstream.LimitsPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := Derive(testCtx(t), cfg, nil, time.Now()); !errors.Is(err, ErrUnboundedReplay) {
		t.Fatalf("MaxAge=0: want ErrUnboundedReplay, got %v", err)
	}
	cfg.Retention.MaxReplayAge.Duration = 720 * time.Hour
	wantWindow(t, mustDerive(t, cfg, nil), 721*time.Hour, "maxReplayAge=720h (spec)")
}

func TestJetStreamLiveBackoffAndWorkQueue(t *testing.T) {
	js := natsJS(t)
	name := strings.ToUpper(unique("IDC_RET_WQ"))
	createStream(t, js, jetstream.StreamConfig{Name: name, Retention: jetstream.WorkQueuePolicy})
	if _, err := js.CreateConsumer(testCtx(t), name, jetstream.ConsumerConfig{
		Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 4,
		BackOff: []time.Duration{time.Second, 10 * time.Second, time.Minute},
	}); err != nil {
		t.Fatal(err)
	}
	// Workqueue: no replay. A = 1s + 10s + 1m + 1m = 2m11s, O = 1h, L = ∞.
	res := mustDerive(t, jsConfig(name, "worker", retention(time.Hour, time.Minute, 0)), nil)
	wantWindow(t, res, time.Hour+2*time.Minute+11*time.Second+time.Minute, "retention=workqueue", "backoff=[1s,10s,1m]")
	if res.ReplayHorizon.String() != "0s" {
		t.Errorf("replay %s", res.ReplayHorizon)
	}
}

func TestJetStreamLiveMissingConsumerUsesDefaults(t *testing.T) {
	js := natsJS(t)
	name := strings.ToUpper(unique("IDC_RET_NC"))
	createStream(t, js, jetstream.StreamConfig{Name: name, MaxAge: 6 * time.Hour})
	// Defaults: ack_wait=30s, max_deliver=-1 (A=∞): R_redeliver = L = 6h.
	res := mustDerive(t, jsConfig(name, "not-yet", retention(24*time.Hour, time.Hour, 0)), nil)
	wantWindow(t, res, 7*time.Hour, "consumer not-yet does not exist yet: JetStream defaults ack_wait=30s max_deliver=-1")
}

func TestJetStreamLiveErrors(t *testing.T) {
	natsJS(t) // the server must be up for the not-found case to mean anything
	_, err := Derive(testCtx(t), jsConfig(strings.ToUpper(unique("IDC_RET_NONE")), "c", retention(time.Hour, time.Hour, 0)), nil, time.Now())
	if !errors.Is(err, ErrSourceNotFound) {
		t.Fatalf("missing stream: want ErrSourceNotFound, got %v", err)
	}
	cfg := baseConfig(config.Source{NATSJetStream: &config.JetStream{URL: "nats://idc:s3cret-pw@127.0.0.1:1", Stream: "S", Consumer: "c"}},
		retention(time.Hour, time.Hour, 0))
	wantUnreachable(t, cfg, nil, "s3cret-pw")
}
