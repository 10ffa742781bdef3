package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
	jsadapter "github.com/idempotency-dev/idc-operator/runtime/source/jetstream"
)

// runJetStream is one row: n replicas of the binary on a new durable
// consumer of the stream (created by the runtime, so sized by it).
func (t *throughputEnv) runJetStream(b *testing.B, replicas, batch int) row {
	b.Helper()
	return t.runJetStreamWith(b, replicas, batch, config.BatchingAdaptive)
}

func (t *throughputEnv) runJetStreamWith(b *testing.B, replicas, batch int, batching config.Batching) row {
	b.Helper()
	return t.runJetStreamEnv(b, replicas, batch, batching)
}

// baselineEnv names an earlier idc-runtime binary for @base rows.
const baselineEnv = "IDC_BENCH_BASELINE_BIN"

func (t *throughputEnv) runJetStreamEnv(b *testing.B, replicas, batch int, batching config.Batching, env ...string) row {
	b.Helper()
	return t.jetStreamRow(b, replicas, batch, batching, len(t.w.bodies), env...)
}

// runJetStreamUpTo is a row timed over the first limit messages of the
// stream only (the per-message row: at one transaction per message the
// whole stream would take minutes). Its check is the partial one
// (checkPartial).
func (t *throughputEnv) runJetStreamUpTo(b *testing.B, replicas, batch, limit int) row {
	b.Helper()
	r := t.jetStreamRow(b, replicas, batch, config.BatchingAdaptive, limit)
	r.note = fmt.Sprintf("the first %d messages of the stream", limit)
	return r
}

// jetStreamRow runs the row until limit messages are acknowledged (the
// whole stream: checkResult; fewer: checkPartial).
func (t *throughputEnv) jetStreamRow(b *testing.B, replicas, batch int, batching config.Batching, limit int, env ...string) row {
	b.Helper()
	if len(env) == 1 && strings.HasPrefix(env[0], "@") {
		// A baseline row: "@<replicas>x<batch>", the config without the
		// fields the earlier binary does not know.
		if _, err := fmt.Sscanf(env[0], "@%dx%d", &replicas, &batch); err != nil {
			b.Fatal(err)
		}
		env = nil
	}
	stream := t.jetStreamStream(b)
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{NATSJetStream: &config.JetStream{URL: t.nats.url(), Stream: stream, Consumer: "c_" + schema}}, batch)
	cfg.Delivery.Batching = batching
	if dir := os.Getenv("IDC_BENCH_CPU_PROFILES"); dir != "" {
		// A diagnostic: every JetStream replica writes a CPU profile.
		env = append(env, "IDC_CPU_PROFILE="+filepath.Join(dir, fmt.Sprintf("%s-r%d-b%d-{replica}.pprof", schema, replicas, batch)))
	}
	rs := t.startReplicas(b, cfg, replicas, env...)
	rs.acked = t.jetStreamAcked(stream, "c_"+schema, len(t.w.bodies))
	locks := t.sampleLockWaits()
	timed, elapsed, rss := rs.measure(b, t.rowName("jetstream"), limit)
	lockStats := locks()
	if limit < len(t.w.bodies) {
		t.checkPartial(b, schema)
	} else {
		t.checkResult(b, schema)
	}
	if err := t.nats.js.DeleteConsumer(context.Background(), stream, "c_"+schema); err != nil {
		b.Fatalf("deleting the row's durable consumer: %v", err)
	}
	rs.cpu.sink = t.sink.kind()
	return row{name: t.rowName("jetstream_upsert"), replicas: replicas, batch: batch, msgs: timed, elapsed: elapsed, rssMiB: rss, cpu: rs.cpu,
		locks: lockStats, nats: t.nats.version()}
}

// runJetStreamPartitioned is the key-partitioned design for scaling out on
// shared keys: the workload is published to parts subjects by its key's
// hash (<stream>.p<i>.orders, as a NATS subject mapping with partition()
// or a producer that puts the partition in the subject would), and each of
// parts processes runs its own durable consumer filtered to one partition,
// into one inbox and one table. A key is then upserted by one process
// only, so replicas never wait on each other's row locks; dedup is intact
// because a message's copies carry its key, so they land in its partition.
func (t *throughputEnv) runJetStreamPartitioned(b *testing.B, parts, batch int) row {
	b.Helper()
	stream := t.partitionedStream(b, parts)
	schema := t.schema(b)
	cfgs := make([]config.Config, parts)
	for i := range parts {
		durable := fmt.Sprintf("c_%s_p%d", schema, i)
		cfgs[i] = runtimeConfig(schema, config.Source{NATSJetStream: &config.JetStream{URL: t.nats.url(), Stream: stream,
			Consumer: durable, FilterSubject: fmt.Sprintf("%s.p%d.>", stream, i)}}, batch)
		cfgs[i].Delivery.Replicas = 1
	}
	// Settled messages are counted from the replicas' metrics (polled
	// less often far from the end), not from consumer info: on nats-server
	// 2.9 the info of a filtered consumer makes the server count its
	// pending messages by scanning the stream, and eight of them polled
	// every 25 ms took the broker 31 s of CPU for 100k messages (the row
	// ran at 3k msg/s).
	rs := t.startReplicasEach(b, cfgs)
	locks := t.sampleLockWaits()
	timed, elapsed, rss := rs.measure(b, "jetstream partitioned", len(t.w.bodies))
	lockStats := locks()
	t.checkResult(b, schema)
	for i := range parts {
		if err := t.nats.js.DeleteConsumer(context.Background(), stream, fmt.Sprintf("c_%s_p%d", schema, i)); err != nil {
			b.Fatalf("deleting partition %d's durable consumer: %v", i, err)
		}
	}
	return row{name: "jetstream_upsert_partitioned", replicas: parts, batch: batch, msgs: timed, elapsed: elapsed, rssMiB: rss,
		cpu: rs.cpu, locks: lockStats, nats: t.nats.version(), note: fmt.Sprintf("%d subject partitions by key, one consumer each", parts)}
}

// partitionedStream publishes the workload on a stream of its own, each
// message to <stream>.p<fnv32a(key) mod parts>.orders.
func (t *throughputEnv) partitionedStream(b *testing.B, parts int) string {
	b.Helper()
	return t.publishStreamTo(b, fmt.Sprintf("IDC_PART%d", parts), t.w.bodies, func(stream string, body []byte) string {
		var o order
		if err := json.Unmarshal(body, &o); err != nil {
			b.Fatal(err)
		}
		h := fnv.New32a()
		_, _ = h.Write([]byte(o.Key))
		return fmt.Sprintf("%s.p%d.orders", stream, h.Sum32()%uint32(parts))
	})
}

// jetStreamAcked counts the messages the durable consumer has had
// acknowledged (of the stream's total), read from NATS:
// one request per poll whatever the replica count. Scraping every replica's
// /metrics every 25 ms instead cost the replicas CPU in proportion to their
// number (measured: see README), which the scale-out rows then paid for.
func (t *throughputEnv) jetStreamAcked(stream, durable string, total int) func() int {
	js := t.nats.js
	return func() int {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := js.Consumer(ctx, stream, durable)
		if err != nil {
			return 0 // not created yet by the replicas
		}
		// Every stream message is pending delivery, pending ack, or acked;
		// redeliveries count once (Delivered.Consumer would count them
		// again).
		info := c.CachedInfo()
		return total - int(info.NumPending) - info.NumAckPending
	}
}

// jetStreamStream publishes the workload once per environment on a stream
// every JetStream row of that environment reads with its own durable
// consumer. The stream belongs to the environment (the benchmark that made
// it deletes it at its end), so it is never shared between benchmarks: a
// process-wide one left BenchmarkThroughput reading the stream
// BenchmarkDeclaredLimits had deleted.
func (t *throughputEnv) jetStreamStream(b *testing.B) string {
	b.Helper()
	if t.nats.stream == "" {
		t.nats.stream = t.publishStream(b, "IDC_TPUT", t.w.bodies)
	}
	return t.nats.stream
}

// consumeAlone runs n in-process adapters, each fetching batches of 500 and
// acknowledging them at once: the broker's own consume + ack rate.
// natsPID is the NATS server whose CPU the row's nats= counts (0: every
// nats-server).
func consumeAlone(b *testing.B, name string, total int, open func(i int) source.Source, n, natsPID int) row {
	b.Helper()
	srcs := make([]source.Source, n)
	for i := range srcs {
		srcs[i] = open(i)
	}
	var mu sync.Mutex
	done := 0
	ctx, cancel := context.WithTimeout(context.Background(), rowTimeout)
	defer cancel()
	var wg sync.WaitGroup
	cpuStart := takeCPU(natsPID)
	start := time.Now()
	for _, s := range srcs {
		wg.Go(func() {
			for ctx.Err() == nil {
				mu.Lock()
				finished := done >= total
				mu.Unlock()
				if finished {
					return
				}
				msgs, err := s.Fetch(ctx, batchSize, maxWait)
				if err == nil && len(msgs) > 0 {
					err = s.Ack(ctx, msgs)
				}
				if err != nil && ctx.Err() == nil {
					b.Errorf("%s: %v", name, err)
					return
				}
				mu.Lock()
				done += len(msgs)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuSince(cpuStart)
	for _, s := range srcs {
		_ = s.Close()
	}
	if done < total {
		b.Fatalf("%s: consumed %d of %d", name, done, total)
	}
	return row{name: name, replicas: n, batch: batchSize, msgs: done, elapsed: elapsed, cpu: cpu, note: "broker alone: consume + ack, no database"}
}

func (t *throughputEnv) jetStreamAlone(b *testing.B, n int) row {
	b.Helper()
	stream := t.jetStreamStream(b)
	cfg := &config.JetStream{URL: t.nats.url(), Stream: stream, Consumer: fmt.Sprintf("alone_%d", time.Now().UnixNano())}
	d := config.Delivery{BatchSize: batchSize, InFlight: 2, Replicas: n}
	r := consumeAlone(b, "jetstream_alone", len(t.w.bodies), func(int) source.Source {
		s, err := jsadapter.New(context.Background(), cfg, logr.Discard(), jsadapter.WithDelivery(d))
		if err != nil {
			b.Fatal(err)
		}
		return s
	}, n, t.nats.pid)
	r.nats = t.nats.version()
	return r
}
