package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// TestLagGauge: 500 published to JetStream and none consumed give
// idc_source_lag_messages 500; idc_consumer_ready follows /readyz.
func TestLagGauge(t *testing.T) {
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		t.Fatalf("NATS JetStream is required for this test: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := fmt.Sprintf("IDC_GAUGE_%d", time.Now().UnixNano())
	subject := strings.ToLower(name) + ".orders"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	if _, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "projector", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		if _, err := js.Publish(ctx, subject, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	state := newLoopState(time.Second)
	g, err := newOpsGauges(prometheus.NewRegistry(), state)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{Source: config.Source{NATSJetStream: &config.JetStream{URL: "nats://127.0.0.1:4222", Stream: name, Consumer: "projector"}}}
	g.readLag(ctx, cfg, logr.Discard())
	if got := testutil.ToFloat64(g.lag); got != 500 {
		t.Fatalf("idc_source_lag_messages = %v, want 500", got)
	}
	// A read that fails keeps the last value.
	cfg.Source.NATSJetStream.Consumer = "nobody"
	g.readLag(ctx, cfg, logr.Discard())
	if got := testutil.ToFloat64(g.lag); got != 500 {
		t.Fatalf("after a failed read idc_source_lag_messages = %v, want the last value 500", got)
	}
}
