package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// BenchmarkDeclaredLimits keeps the broker-limit effect visible: 4 replicas
// x 500 on one JetStream consumer whose MaxAckPending was sized for the
// replica count declared in the config (the runtime creates it for 4), and
// on one sized for 1 replica (the count left undeclared: what an autoscaler
// that scales past the declared count runs into; the operator avoids it by
// sizing for spec.runtime.autoscaling.maxReplicas). Each row runs twice and
// keeps its better run. Prints two BENCH rows and a RATIO line.
func BenchmarkDeclaredLimits(b *testing.B) {
	const replicas, batch = 4, 500
	t := newThroughputEnv(b, newWorkload())
	for range b.N {
		declared := fasterRow(t.runJetStreamSizedFor(b, replicas, batch, replicas), t.runJetStreamSizedFor(b, replicas, batch, replicas))
		undeclared := fasterRow(t.runJetStreamSizedFor(b, replicas, batch, 1), t.runJetStreamSizedFor(b, replicas, batch, 1))
		declared.name, undeclared.name = "jetstream_upsert_limits_declared", "jetstream_upsert_limits_undeclared"
		printRow(declared)
		printRow(undeclared)
		fmt.Printf("RATIO limits_undeclared_vs_declared_at_%d_replicas=%.2f\n", replicas, undeclared.rate()/declared.rate())
		b.ReportMetric(undeclared.rate()/declared.rate(), "undeclared_vs_declared")
	}
}

// runJetStreamSizedFor is runJetStream with the durable consumer made
// beforehand, as a user would, with MaxAckPending sized for sizedFor
// replicas (4 x sizedFor x batch x inFlight): the runtime binds to a
// consumer it did not create as it is.
func (t *throughputEnv) runJetStreamSizedFor(b *testing.B, replicas, batch, sizedFor int) row {
	b.Helper()
	stream := t.jetStreamStream(b)
	schema := t.schema(b)
	durable := "c_" + schema
	cfg := runtimeConfig(schema, config.Source{NATSJetStream: &config.JetStream{URL: t.nats.url(), Stream: stream, Consumer: durable}}, batch)
	d := cfg.Delivery
	d.InFlight = max(d.InFlight, 2) // the runtime's default
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := t.nats.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: d.SizedUnacked(sizedFor),
	}); err != nil {
		b.Fatalf("creating the consumer sized for %d replicas: %v", sizedFor, err)
	}
	rs := t.startReplicas(b, cfg, replicas)
	rs.acked = t.jetStreamAcked(stream, durable, len(t.w.bodies))
	timed, elapsed, rss := rs.measure(b, "jetstream", len(t.w.bodies))
	t.checkResult(b, schema)
	if err := t.nats.js.DeleteConsumer(context.Background(), stream, durable); err != nil {
		b.Fatalf("deleting the row's durable consumer: %v", err)
	}
	return row{name: "jetstream_upsert", replicas: replicas, batch: batch, msgs: timed, elapsed: elapsed, rssMiB: rss, cpu: rs.cpu, nats: t.nats.version()}
}
