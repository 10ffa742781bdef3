package retention

// Live tests against real brokers: NATS JetStream (the built nats-server
// 2.15.3 that TestMain starts on its own loopback port, or with
// IDC_TEST_NATS=system the machine's 2.9.10 on 127.0.0.1:4222), and the
// services this machine runs on loopback: RabbitMQ (127.0.0.1:5672,
// management API on 15672, guest/guest) and Redis (127.0.0.1:6379). They
// fail, never skip, when a service is down (start them with `make
// services`; the nats-server is built by `make nats`). Kafka has no server
// here: kafka_test.go uses franz-go's in-process kfake cluster.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

var seq atomic.Int64

// unique returns a name no other test (or earlier run) uses.
func unique(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, time.Now().UnixNano(), seq.Add(1))
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func baseConfig(src config.Source, r config.Retention) *config.Config {
	if r.Mode == "" {
		r.Mode = ModeDerived
	}
	return &config.Config{Version: config.Version, Name: "test/idc", Source: src, Retention: r}
}

func retention(outage, margin, maxReplayAge time.Duration) config.Retention {
	return config.Retention{
		MaxConsumerOutage: config.Duration{Duration: outage},
		SafetyMargin:      config.Duration{Duration: margin},
		MaxReplayAge:      config.Duration{Duration: maxReplayAge},
	}
}

func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func mustDerive(t *testing.T, cfg *config.Config, getenv func(string) string) Result {
	t.Helper()
	res, err := Derive(testCtx(t), cfg, getenv, time.Now())
	if err != nil {
		t.Fatalf("Derive: %v", err)
	}
	return res
}

func wantWindow(t *testing.T, res Result, window time.Duration, parts ...string) {
	t.Helper()
	t.Logf("window=%s redelivery=%s replay=%s source=%s hash=%s derivedFrom: %s",
		FormatDuration(res.Window), res.RedeliveryHorizon, res.ReplayHorizon, res.Source, res.InputsHash, res.DerivedFrom)
	if res.Window != window {
		t.Fatalf("window %s, want %s (derivedFrom: %s)", res.Window, window, res.DerivedFrom)
	}
	for _, p := range parts {
		if !strings.Contains(res.DerivedFrom, p) {
			t.Errorf("DerivedFrom %q lacks %q", res.DerivedFrom, p)
		}
	}
}

func wantUnreachable(t *testing.T, cfg *config.Config, getenv func(string) string, secret string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Derive(ctx, cfg, getenv, time.Now())
	if !errors.Is(err, ErrBrokerUnreachable) {
		t.Fatalf("want ErrBrokerUnreachable, got %v", err)
	}
	if secret != "" && strings.Contains(err.Error(), secret) {
		t.Fatalf("error leaks a credential: %v", err)
	}
	t.Logf("unreachable after %s: %v", time.Since(start).Round(time.Millisecond), err)
}

func TestExplicitModeDoesNotReadTheBroker(t *testing.T) {
	// The source points at a closed port: Explicit mode must not care.
	cfg := baseConfig(config.Source{NATSJetStream: &config.JetStream{URL: "nats://127.0.0.1:1", Stream: "S", Consumer: "c"}},
		config.Retention{Mode: ModeExplicit, Window: config.Duration{Duration: 168 * time.Hour}})
	res := mustDerive(t, cfg, nil)
	wantWindow(t, res, 168*time.Hour, "mode=Explicit (spec)", "window=168h (spec)")
	if res.Source != SourceDeclared {
		t.Errorf("source %s", res.Source)
	}
}
