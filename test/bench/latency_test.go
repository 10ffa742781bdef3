package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// End-to-end latency: publish -> effect committed, at a steady offered load.
//
// The producer (this process) stamps each message with time.Now() just
// before it hands it to the broker client. "Committed" is when this
// process, LISTENing on a channel, receives the NOTIFY that a statement
// trigger on the row's inbox sends from the claim transaction: PostgreSQL
// delivers a notification only after the transaction that sent it has
// committed (with synchronous_commit on, after its COMMIT record was flushed),
// so the stamp is never before the commit, and late by the delivery of the
// notification (well under a millisecond on loopback). The claim, the effect
// and the dead letters are one transaction, so the claim's commit is the
// effect's. Each NOTIFY carries the transaction id; after the row, the inbox
// rows' xmin maps every message to its transaction. Both stamps come from
// this one process's clock. The trigger (one pg_notify per transaction) is
// the only thing added to the runtime's transactions.
const (
	// latencyWarmup is published at the row's rate before the measured
	// window (the replicas connect, the pools and caches fill); its
	// messages are not measured.
	latencyWarmup = 2 * time.Second
	// latencySecondsEnv overrides the measured window (default 10 s).
	latencySecondsEnv = "IDC_BENCH_LATENCY_SECONDS"
	// latencyKeys is the entity key space of the latency workload; a key's
	// versions increase with the publish order.
	latencyKeys = 20000
)

func latencyWindow() time.Duration {
	if v := os.Getenv(latencySecondsEnv); v != "" {
		if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
			return time.Duration(s * float64(time.Second))
		}
	}
	return 10 * time.Second
}

// latencyBody is message n of the latency workload.
func latencyBody(n int) []byte {
	b, _ := json.Marshal(order{ID: "L" + strconv.Itoa(n), Key: fmt.Sprintf("k%05d", n%latencyKeys), Version: n/latencyKeys + 1,
		Status: "s", Amount: n})
	return b
}

// latencyRow is one LATENCY line.
type latencyRow struct {
	name            string
	replicas, batch int
	batching        config.Batching
	load            float64 // share of the measured maximum
	// loadOf names that maximum when it is not the backlog row's
	// ("sustained_max": what a 90% row committed with the producer running).
	loadOf         string
	offered        float64 // msgs/s published in the window
	achieved       float64 // msgs/s committed in the window
	msgs           int     // measured messages
	p50, p99, p999 time.Duration
	maxLat         time.Duration
	cpu            *cpuUse
	txs            int // the replicas' transactions in the window
	slowCommits    int // of them, COMMITs that took more than 256 ms
	checkpoints    int // PostgreSQL checkpoints (timed and requested) that began in the window
	probe          string
	note           string
}

func printLatency(r latencyRow) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }
	note := ""
	if r.loadOf != "" {
		note = " load_of=" + r.loadOf
	}
	if r.note != "" {
		note += " note=" + strconv.Quote(r.note)
	}
	cpu := ""
	if r.cpu != nil {
		// Where the cores went while the producer published: the offered
		// load's own cost (the producer in this process, the broker's
		// ingest) shares the two cores with the runtime and PostgreSQL,
		// which the measured maximum (a pre-filled backlog) did not.
		c := r.cpu
		cores := func(d time.Duration) float64 { return d.Seconds() / c.wall.Seconds() }
		total := c.nats + c.postgres + c.runtime + c.self + c.rabbit + c.redis
		cpu = fmt.Sprintf(" cores_busy=%.2f idc_runtime_cores=%.2f postgres_cores=%.2f broker_cores=%.2f bench_cores=%.2f",
			cores(total), cores(c.runtime), cores(c.postgres), cores(c.nats+c.rabbit+c.redis), cores(c.self))
	}
	if r.txs > 0 {
		cpu += fmt.Sprintf(" txs=%d msgs_per_tx=%.1f commits_over_256ms=%d pg_checkpoints=%d", r.txs, r.achieved*r.cpu.wall.Seconds()/float64(r.txs), r.slowCommits, r.checkpoints)
	}
	if r.probe != "" {
		cpu += " " + r.probe
	}
	fmt.Printf("LATENCY row=%s replicas=%d batch=%d batching=%s load=%.2f offered_msgs_per_s=%.0f achieved_msgs_per_s=%.0f msgs=%d p50_ms=%s p99_ms=%s p999_ms=%s max_ms=%s%s%s\n",
		r.name, r.replicas, r.batch, strings.ToLower(string(r.batching)), r.load, r.offered, r.achieved, r.msgs,
		ms(r.p50), ms(r.p99), ms(r.p999), ms(r.maxLat), cpu, note)
}

// latencyPublisher hands message n (with its body) to a broker. flush
// pushes out what a client buffered; it runs after every paced burst.
type latencyPublisher struct {
	send  func(n int, body []byte) error
	flush func() error
}

// latencyRun drives one latency row: replicas started by start on a fresh
// schema, messages published by pub at rate msgs/s for the warm-up and
// the window, every message's commit time read from the notifications.
func (t *throughputEnv) latencyRun(b *testing.B, name string, cfg config.Config, replicas int, rate, load float64,
	pub latencyPublisher) latencyRow {
	b.Helper()
	schema := cfg.Sink.Schema
	ctx := context.Background()
	var env []string
	if dir := os.Getenv("IDC_BENCH_CPU_PROFILES"); dir != "" {
		// A diagnostic: every replica writes a CPU profile.
		env = append(env, "IDC_CPU_PROFILE="+fmt.Sprintf("%s/%s-%s-%s-%.2f-{replica}.pprof", dir, name, schema,
			strings.ToLower(string(cfg.Delivery.Batching)), load))
	}
	rs := t.startReplicas(b, cfg, replicas, env...)
	t.waitForTable(b, schema+".inbox")
	listener := t.listenCommits(b, schema)
	rs.waitReady(b)
	probes := t.startProbes(b)
	window := latencyWindow()
	total := int(rate * (latencyWarmup + window).Seconds())
	stamps := make([]time.Time, total)
	// Paced: every millisecond (or as soon as the last burst went out) the
	// producer publishes what the rate owes by then.
	start := time.Now()
	var windowStart, windowEnd time.Time
	var cpuStart cpuSnapshot
	var txStart, slowStart, ckptStart int
	sent := 0
	for sent < total {
		due := min(total, int(rate*time.Since(start).Seconds())+1)
		for ; sent < due; sent++ {
			stamps[sent] = time.Now()
			if err := pub.send(sent, latencyBody(sent)); err != nil {
				b.Fatalf("%s: publishing: %v", name, err)
			}
		}
		if err := pub.flush(); err != nil {
			b.Fatalf("%s: flushing: %v", name, err)
		}
		if windowStart.IsZero() && time.Since(start) >= latencyWarmup {
			windowStart = time.Now()
			cpuStart = takeCPU(rs.pids()...)
			txStart, _ = rs.commits()
			slowStart = rs.slowCommits()
			ckptStart = t.checkpoints(b)
		}
		time.Sleep(time.Millisecond)
	}
	windowEnd = time.Now()
	probe := probes()
	cpu := cpuSince(cpuStart, rs.pids()...)
	ckpts := t.checkpoints(b) - ckptStart
	txEnd, _ := rs.commits()
	slow := rs.slowCommits() - slowStart
	// Wait until every message is claimed (and so committed).
	deadline := time.Now().Add(rowTimeout)
	for {
		var n int
		if err := t.pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".inbox").Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n >= total {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: %d of %d messages committed after %s; logs: %v", name, n, total, rowTimeout, rs.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	commits := listener.stop(b, total)
	rs.stop()
	if dir := os.Getenv("IDC_BENCH_LATENCY_DUMP"); dir != "" {
		for i, l := range rs.logs { // the replicas' logs beside the dump
			if data, err := os.ReadFile(l); err == nil {
				_ = os.WriteFile(fmt.Sprintf("%s/%s-%s-%.2f-r%d.log", dir, name, strings.ToLower(string(cfg.Delivery.Batching)), load, i), data, 0o600)
			}
		}
	}
	rows, err := t.pool.Query(ctx, "SELECT message_id, xmin::text::bigint FROM "+schema+".inbox")
	if err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, total)
	var dump *os.File
	if dir := os.Getenv("IDC_BENCH_LATENCY_DUMP"); dir != "" {
		// A diagnostic: every measured message's publish offset and latency.
		if dump, err = os.Create(fmt.Sprintf("%s/%s-%s-%.2f.txt", dir, name, strings.ToLower(string(cfg.Delivery.Batching)), load)); err != nil {
			b.Fatal(err)
		}
	}
	inWindow, missing := 0, 0
	for rows.Next() {
		var id string
		var xid int64
		if err := rows.Scan(&id, &xid); err != nil {
			b.Fatal(err)
		}
		n, err := strconv.Atoi(strings.TrimPrefix(id, "L"))
		if err != nil || n < 0 || n >= total {
			b.Fatalf("%s: unexpected inbox id %q", name, id)
		}
		at, ok := commits[xid]
		if !ok {
			missing++
			continue
		}
		if !at.Before(windowStart) && at.Before(windowEnd) {
			inWindow++
		}
		if stamps[n].Before(windowStart) {
			continue // warm-up
		}
		lat = append(lat, at.Sub(stamps[n]))
		if dump != nil {
			fmt.Fprintf(dump, "%d %.3f %.3f %d\n", n, stamps[n].Sub(windowStart).Seconds(), float64(at.Sub(stamps[n]).Microseconds())/1000, xid)
		}
	}
	if dump != nil {
		_ = dump.Close()
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	if missing > 0 {
		b.Fatalf("%s: %d messages committed by transactions whose notification never arrived", name, missing)
	}
	t.dropSchema(b, schema)
	slices.Sort(lat)
	measured := 0
	for _, s := range stamps {
		if !s.Before(windowStart) {
			measured++
		}
	}
	w := windowEnd.Sub(windowStart).Seconds()
	batching := cfg.Delivery.Batching
	if batching == "" {
		batching = config.BatchingAdaptive // the runtime's default
	}
	return latencyRow{name: name, replicas: replicas, batch: cfg.Delivery.BatchSize, batching: batching, load: load,
		offered: float64(measured) / w, achieved: float64(inWindow) / w, msgs: len(lat),
		p50: quantile(lat, 0.50), p99: quantile(lat, 0.99), p999: quantile(lat, 0.999), maxLat: lat[len(lat)-1], cpu: cpu,
		txs: txEnd - txStart, slowCommits: slow, checkpoints: ckpts, probe: probe}
}

// quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// waitForTable waits until the replicas created the table.
func (t *throughputEnv) waitForTable(b *testing.B, table string) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var ok bool
		if err := t.pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil {
			b.Fatal(err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the replicas did not create %s in a minute", table)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// commitListener records when each claim transaction's NOTIFY arrived.
type commitListener struct {
	conn   *pgx.Conn
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	at     map[int64]time.Time
	err    error
}

// listenCommits adds the notifying trigger to the schema's inbox and
// starts listening.
func (t *throughputEnv) listenCommits(b *testing.B, schema string) *commitListener {
	b.Helper()
	ctx := context.Background()
	channel := "idc_lat_" + schema
	for _, q := range []string{
		`CREATE FUNCTION ` + schema + `.notify_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_notify('` + channel + `', (txid_current() % 4294967296)::text); RETURN NULL; END $$`,
		`CREATE TRIGGER notify_commit AFTER INSERT ON ` + schema + `.inbox FOR EACH STATEMENT EXECUTE FUNCTION ` + schema + `.notify_commit()`,
	} {
		if _, err := t.pool.Exec(ctx, q); err != nil {
			b.Fatalf("running %q: %v", q, err)
		}
	}
	conn, err := pgx.Connect(ctx, t.dsn)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		b.Fatal(err)
	}
	lctx, cancel := context.WithCancel(ctx)
	l := &commitListener{conn: conn, cancel: cancel, done: make(chan struct{}), at: map[int64]time.Time{}}
	go func() {
		defer close(l.done)
		for {
			n, err := conn.WaitForNotification(lctx)
			now := time.Now()
			if err != nil {
				if lctx.Err() == nil {
					l.mu.Lock()
					l.err = err
					l.mu.Unlock()
				}
				return
			}
			xid, err := strconv.ParseInt(n.Payload, 10, 64)
			if err != nil {
				continue
			}
			l.mu.Lock()
			l.at[xid] = now
			l.mu.Unlock()
		}
	}()
	return l
}

// stop ends the listener once the notifications stopped coming (the last
// commits' may still be on their way) and returns them.
func (l *commitListener) stop(b *testing.B, _ int) map[int64]time.Time {
	b.Helper()
	size := -1
	for {
		time.Sleep(100 * time.Millisecond)
		l.mu.Lock()
		n := len(l.at)
		l.mu.Unlock()
		if n == size {
			break
		}
		size = n
	}
	l.cancel()
	<-l.done
	_ = l.conn.Close(context.Background())
	if l.err != nil {
		b.Fatalf("listening for commits: %v", l.err)
	}
	return l.at
}

// --- the rows ---

// latencyJetStream is JetStream -> upsert at replicas x batch, rate msgs/s.
func (t *throughputEnv) latencyJetStream(b *testing.B, replicas, batch int, batching config.Batching, rate, load float64) latencyRow {
	b.Helper()
	return t.latencyJetStreamNamed(b, "jetstream_upsert", replicas, batch, batching, rate, load)
}

func (t *throughputEnv) latencyJetStreamNamed(b *testing.B, name string, replicas, batch int, batching config.Batching, rate, load float64) latencyRow {
	b.Helper()
	ctx := context.Background()
	t.runs++
	stream := fmt.Sprintf("IDC_LAT_%d_%d", time.Now().UnixNano(), t.runs)
	if _, err := t.js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}}); err != nil {
		b.Fatalf("creating stream: %v", err)
	}
	defer func() { _ = t.js.DeleteStream(context.Background(), stream) }()
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: stream, Consumer: "c_" + schema}}, batch)
	cfg.Delivery.Batching = batching
	nc, err := nats.Connect(natsURL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	subject := stream + ".orders"
	r := t.latencyRun(b, name, cfg, replicas, rate, load, latencyPublisher{
		// Core publishes into the stream's subject: the cheapest producer,
		// so the producer's own work takes the least from the two cores.
		send:  func(_ int, body []byte) error { return nc.Publish(subject, body) },
		flush: func() error { return nil }, // nats.go's flusher writes as soon as it can
	})
	return r
}

func (t *throughputEnv) latencyRabbitMQ(b *testing.B, rate, load float64) latencyRow {
	b.Helper()
	q := t.emptyRabbitQueue(b)
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: amqpURIEnv, Queue: q}}, batchSize)
	conn, err := amqp.Dial(amqpURI)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	return t.latencyRun(b, "rabbitmq_upsert", cfg, 2, rate, load, latencyPublisher{
		send: func(_ int, body []byte) error {
			return ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, Timestamp: time.Now(), Body: body})
		},
		flush: func() error { return nil },
	})
}

func (t *throughputEnv) emptyRabbitQueue(b *testing.B) string {
	b.Helper()
	conn, err := amqp.Dial(amqpURI)
	if err != nil {
		b.Fatalf("RabbitMQ at 127.0.0.1:5672 is required for the benchmark: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	q := fmt.Sprintf("idc-lat-%d", time.Now().UnixNano())
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if c, err := amqp.Dial(amqpURI); err == nil {
			if ch, err := c.Channel(); err == nil {
				_, _ = ch.QueueDelete(q, false, false, false)
			}
			_ = c.Close()
		}
	})
	return q
}

func (t *throughputEnv) latencyRedis(b *testing.B, rate, load float64) latencyRow {
	b.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	stream := fmt.Sprintf("idc-lat-%d", time.Now().UnixNano())
	defer func() { _ = rdb.Del(context.Background(), stream).Err() }()
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{RedisStreams: &config.RedisStreams{Address: redisAddr, Stream: stream, Group: "g"}}, batchSize)
	pipe := rdb.Pipeline()
	return t.latencyRun(b, "redis_upsert", cfg, 2, rate, load, latencyPublisher{
		// A burst's entries go out in one pipeline after their stamps:
		// their latency includes the wait for the burst's last XADD.
		send: func(_ int, body []byte) error {
			pipe.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{"body", body}})
			return nil
		},
		flush: func() error {
			if pipe.Len() == 0 {
				return nil
			}
			_, err := pipe.Exec(context.Background())
			return err
		},
	})
}

func (t *throughputEnv) latencyKafka(b *testing.B, rate, load float64) latencyRow {
	b.Helper()
	const topic = "idc-lat"
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topic))
	if err != nil {
		b.Fatal(err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{Kafka: &config.Kafka{BootstrapServers: cluster.ListenAddrs(), Topics: []string{topic}, ConsumerGroup: "g"}}, batchSize)
	var mu sync.Mutex
	var produceErr error
	r := t.latencyRun(b, "kafka_kfake_upsert", cfg, 2, rate, load, latencyPublisher{
		send: func(n int, body []byte) error {
			cl.Produce(context.Background(), &kgo.Record{Key: []byte(fmt.Sprintf("k%05d", n%latencyKeys)), Value: body}, func(_ *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					produceErr = err
					mu.Unlock()
				}
			})
			mu.Lock()
			defer mu.Unlock()
			return produceErr
		},
		flush: func() error { return nil },
	})
	r.note = "kfake in-process: NOT representative of a real Kafka broker"
	return r
}

// latencyRows prints the LATENCY lines: JetStream -> upsert at 2 x 500 at
// 10%, 50% and 90% of jetStreamMax (the headline row of this run), the
// 10% and 90% points again with batching Fixed (side by side), and
// RabbitMQ, Redis Streams and Kafka (kfake) at 50% of their own rows (a
// zero rate skips the row).
func (t *throughputEnv) latencyRows(b *testing.B, jetStreamMax, rabbitMax, redisMax, kafkaMax float64) {
	b.Helper()
	// sustained is the most a 90% row committed; it is what the machine
	// sustains once one of them fell behind.
	sustained, behind := 0.0, false
	for _, p := range []struct {
		load     float64
		batching config.Batching
	}{
		{0.1, config.BatchingAdaptive}, {0.1, config.BatchingFixed},
		{0.5, config.BatchingAdaptive},
		{0.9, config.BatchingAdaptive}, {0.9, config.BatchingFixed},
	} {
		r := t.latencyJetStream(b, 2, batchSize, p.batching, p.load*jetStreamMax, p.load)
		printLatency(r)
		if p.load == 0.9 {
			behind = behind || r.achieved < 0.95*r.offered
			sustained = max(sustained, r.achieved)
		}
	}
	if behind {
		// The maximum above is a pre-filled backlog drained with nothing
		// else running. Here the producer and the broker's ingest share
		// the two cores with the runtime and PostgreSQL: a 90% row that
		// fell behind committed what the machine sustains end to end.
		// Half of that is the load a user can size for on this machine.
		fmt.Printf("RATIO latency_sustained_vs_backlog_max=%.2f\n", sustained/jetStreamMax)
		r := t.latencyJetStreamNamed(b, "jetstream_upsert_sustained", 2, batchSize, config.BatchingAdaptive, 0.5*sustained, 0.5)
		r.loadOf = "sustained_max"
		printLatency(r)
	}
	t.brokerLatencyRows(b, rabbitMax, redisMax, kafkaMax)
}

// brokerLatencyRows prints the RabbitMQ, Redis Streams and Kafka (kfake)
// LATENCY lines at 50% of their own rows (a zero rate skips the row).
func (t *throughputEnv) brokerLatencyRows(b *testing.B, rabbitMax, redisMax, kafkaMax float64) {
	b.Helper()
	if rabbitMax > 0 {
		printLatency(t.latencyRabbitMQ(b, 0.5*rabbitMax, 0.5))
	}
	if redisMax > 0 {
		printLatency(t.latencyRedis(b, 0.5*redisMax, 0.5))
	}
	if kafkaMax > 0 {
		printLatency(t.latencyKafka(b, 0.5*kafkaMax, 0.5))
	}
}

// waitReady waits until every replica answers /readyz (connected, and
// fetched at least once), so a latency row does not time their start-up.
func (rs *replicaSet) waitReady(b *testing.B) {
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for _, u := range rs.metrics {
		ready := strings.TrimSuffix(u, "/metrics") + "/readyz"
		for {
			resp, err := scrapeClient.Get(ready)
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				b.Fatalf("replica %s not ready after a minute; logs: %v", ready, rs.logs)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// slowCommits sums the replicas' COMMITs that took more than 256 ms (the
// idc_commit_duration_seconds buckets): a stalled WAL flush shows there,
// and in every message's latency behind it.
func (rs *replicaSet) slowCommits() int {
	n := 0
	for _, u := range rs.metrics {
		v := scrapeFloats(u, "idc_commit_duration_seconds_count", `idc_commit_duration_seconds_bucket{le="0.256"}`)
		n += int(v[0] - v[1])
	}
	return n
}

// startProbes measures, every 20 ms until the returned func is called, a
// NATS round trip (PING/PONG on a connection of its own) and a PostgreSQL
// round trip (SELECT 1): a stall of the broker or the database (or of the
// whole machine) shows in their maxima, beside the rows' latency.
func (t *throughputEnv) startProbes(b *testing.B) func() string {
	b.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		b.Fatal(err)
	}
	// The disk's own flush latency, beside PostgreSQL's: 8 KiB written and
	// fdatasync'ed every 20 ms to a file in IDC_BENCH_FSYNC_DIR (default
	// the temporary directory, which on this machine is on the one disk
	// PostgreSQL's WAL is on), so a stalled COMMIT can be told apart from
	// a stalled disk. Its own goroutine: a stall delays no other probe.
	f, err := os.CreateTemp(os.Getenv("IDC_BENCH_FSYNC_DIR"), "idc-bench-fsync-*")
	if err != nil {
		nc.Close()
		b.Fatal(err)
	}
	page := make([]byte, 8192)
	stop := make(chan struct{})
	var natsP, pgP, syncP probeStat
	syncDone := tickUntil(stop, 20*time.Millisecond, func() {
		start := time.Now()
		if _, err := f.WriteAt(page, 0); err == nil && syscall.Fdatasync(int(f.Fd())) == nil {
			syncP.add(time.Since(start))
		}
	})
	done := tickUntil(stop, 20*time.Millisecond, func() {
		start := time.Now()
		if err := nc.FlushTimeout(5 * time.Second); err == nil {
			natsP.add(time.Since(start))
		}
		start = time.Now()
		if _, err := t.pool.Exec(context.Background(), "SELECT 1"); err == nil {
			pgP.add(time.Since(start))
		}
	})
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return func() string {
		close(stop)
		<-done
		<-syncDone
		nc.Close()
		_ = f.Close()
		_ = os.Remove(f.Name())
		return fmt.Sprintf("probe_nats_max_ms=%.1f probe_nats_over_250ms=%d probe_pg_max_ms=%.1f probe_pg_over_250ms=%d probe_fsync_max_ms=%.1f probe_fsync_over_250ms=%d",
			ms(natsP.max), natsP.slow, ms(pgP.max), pgP.slow, ms(syncP.max), syncP.slow)
	}
}

// checkpoints is how many checkpoints PostgreSQL has begun since its
// statistics were reset (pg_stat_bgwriter on PostgreSQL 15 and 16,
// pg_stat_checkpointer from 17).
func (t *throughputEnv) checkpoints(b *testing.B) int {
	b.Helper()
	var n int
	err := t.pool.QueryRow(context.Background(), `SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&n)
	if err != nil {
		if err2 := t.pool.QueryRow(context.Background(), `SELECT num_timed + num_requested FROM pg_stat_checkpointer`).Scan(&n); err2 != nil {
			b.Fatalf("reading the checkpoint count: %v; %v", err, err2)
		}
	}
	return n
}

// probeStat is one probe's longest round trip and its count over 250 ms.
type probeStat struct {
	max  time.Duration
	slow int
}

func (p *probeStat) add(d time.Duration) {
	p.max = max(p.max, d)
	if d > 250*time.Millisecond {
		p.slow++
	}
}

// tickUntil calls fn every period, in a goroutine of its own, until stop is
// closed; the returned channel is closed once it returned.
func tickUntil(stop <-chan struct{}, every time.Duration, fn func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			fn()
		}
	}()
	return done
}
