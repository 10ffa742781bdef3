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
	"testing"
	"time"

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
	// floor: the floor consumer's row, not the runtime's.
	floor bool
	// nats is the version of the NATS server of a JetStream row.
	nats string
}

func printLatency(r latencyRow) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }
	note := ""
	if r.nats != "" {
		note = " nats=" + r.nats
	}
	if r.loadOf != "" {
		note += " load_of=" + r.loadOf
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
		consumer := "idc_runtime"
		if r.floor {
			consumer = "floor_consumer"
		}
		cpu = fmt.Sprintf(" cores_busy=%.2f %s_cores=%.2f postgres_cores=%.2f broker_cores=%.2f bench_cores=%.2f",
			cores(total), consumer, cores(c.runtime), cores(c.postgres), cores(c.nats+c.rabbit+c.redis), cores(c.self))
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
	return t.latencyRunWith(b, name, cfg, replicas, rate, load, pub, runtimeConsumer)
}

// latencyConsumer is what a latency row measures: the idc-runtime
// replicas (runtimeConsumer) or the floor consumer (floorConsumer).
type latencyConsumer struct {
	// start starts the replicas of cfg and returns once the table they
	// commit into exists.
	start func(t *throughputEnv, b *testing.B, cfg config.Config, replicas int, env ...string) *replicaSet
	// table is the table each transaction inserts one row per message
	// into, idExpr the message's id in it.
	table, idExpr string
	floor         bool
}

var runtimeConsumer = latencyConsumer{
	start: func(t *throughputEnv, b *testing.B, cfg config.Config, replicas int, env ...string) *replicaSet {
		rs := t.startReplicas(b, cfg, replicas, env...)
		t.waitForTable(b, cfg.Sink.Schema+".inbox")
		return rs
	},
	table: "inbox", idExpr: "message_id",
}

func (t *throughputEnv) latencyRunWith(b *testing.B, name string, cfg config.Config, replicas int, rate, load float64,
	pub latencyPublisher, cons latencyConsumer) latencyRow {
	b.Helper()
	schema := cfg.Sink.Schema
	ctx := context.Background()
	var env []string
	if dir := os.Getenv("IDC_BENCH_CPU_PROFILES"); dir != "" {
		// A diagnostic: every replica writes a CPU profile.
		env = append(env, "IDC_CPU_PROFILE="+fmt.Sprintf("%s/%s-%s-%s-%.2f-{replica}.pprof", dir, name, schema,
			strings.ToLower(string(cfg.Delivery.Batching)), load))
	}
	rs := cons.start(t, b, cfg, replicas, env...)
	table := schema + "." + cons.table
	listener := t.listenCommits(b, schema, table)
	rs.waitReady(b)
	probes := t.startProbes(b)
	window := latencyWindow()
	if t.slice > 0 {
		window = t.slice // an interleaved pair's short slice
	}
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
			cpuStart = takeCPU(rs.natsPID, rs.pids()...)
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
		if err := t.pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
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
	rows, err := t.pool.Query(ctx, "SELECT "+cons.idExpr+", xmin::text::bigint FROM "+table)
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
	return latencyRow{name: name, replicas: replicas, batch: cfg.Delivery.BatchSize, batching: batching, load: load, floor: cons.floor,
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
