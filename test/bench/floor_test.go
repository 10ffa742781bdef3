package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/testbin"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// The floors: what no implementation could beat on this machine, measured
// in the same run as the runtime and interleaved with it (A/B/A/B, short
// slices), so both see the same disk and the same neighbours. Every ratio
// is the median of its pairs, printed with the pairs' spread.
//
// The floor consumer (test/bench/floorconsumer) fetches, inserts the
// batch's bodies with one multi-row INSERT, commits and acknowledges: no
// inbox, no deduplication, no gate, no extraction. It gives NO
// exactly-once guarantee; its figures are a floor to measure against,
// never a product figure.
const (
	floorConsumerPackage = "github.com/idempotency-dev/idc-operator/test/bench/floorconsumer"
	// pairsEnv is how many interleaved pairs each floor ratio takes the
	// median of (default 3).
	pairsEnv = "IDC_BENCH_PAIRS"
	// floorSliceEnv is the measured window of each latency slice of the
	// floor pairs, in seconds (default 5).
	floorSliceEnv = "IDC_BENCH_FLOOR_SLICE_SECONDS"
	floorNote     = "FLOOR consumer: fetch, one multi-row INSERT, COMMIT, ack; no inbox, no dedup, no exactly-once; not a product figure"
	dedupNote     = "FLOOR consumer with an inbox: fetch, claim the ids and INSERT the new bodies in one statement, COMMIT, ack; no extraction, fingerprint, gate or upsert; not a product figure"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func floorSlice() time.Duration {
	if v, err := strconv.ParseFloat(os.Getenv(floorSliceEnv), 64); err == nil && v > 0 {
		return time.Duration(v * float64(time.Second))
	}
	return 5 * time.Second
}

// floorConsumer runs replicas of the floor consumer on one durable pull
// consumer of cfg's stream, into <schema>.floor_sink (body text).
var floorConsumer = floorConsumerWith(false)

// dedupFloorConsumer is the floor consumer with --inbox: each transaction
// also claims the ids in <schema>.floor_inbox and inserts only the new
// ones: the least any inbox adds to the floor. Its figures are a floor too,
// never a product figure.
var dedupFloorConsumer = floorConsumerWith(true)

func floorConsumerWith(dedup bool) latencyConsumer {
	return latencyConsumer{start: func(t *throughputEnv, b *testing.B, cfg config.Config, replicas int, _ ...string) *replicaSet {
		b.Helper()
		if t.floorBin == "" {
			t.floorBin = testbin.Build(b, floorConsumerPackage, "floor-consumer")
		}
		ctx := context.Background()
		schema, js := cfg.Sink.Schema, cfg.Source.NATSJetStream
		table := schema + ".floor_sink"
		if _, err := t.pool.Exec(ctx, "CREATE TABLE "+table+" (body text NOT NULL)"); err != nil {
			b.Fatal(err)
		}
		var inboxArgs []string
		if dedup {
			if _, err := t.pool.Exec(ctx, "CREATE TABLE "+schema+".floor_inbox (message_id text COLLATE \"C\" PRIMARY KEY)"); err != nil {
				b.Fatal(err)
			}
			inboxArgs = []string{"--inbox", schema + ".floor_inbox"}
		}
		// Sized as the runtime sizes its own: every replica's batches in
		// flight, twice.
		if _, err := t.nats.js.CreateOrUpdateConsumer(ctx, js.Stream, jetstream.ConsumerConfig{
			Durable: js.Consumer, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 4 * replicas * cfg.Delivery.BatchSize,
		}); err != nil {
			b.Fatalf("creating the floor's consumer: %v", err)
		}
		rs := &replicaSet{natsPID: t.nats.pid}
		for i := range replicas {
			addr, err := freeAddr()
			if err != nil {
				b.Fatal(err)
			}
			logPath := filepath.Join(t.dir, fmt.Sprintf("%s-floor-r%d.log", schema, i))
			logFile, err := os.Create(logPath)
			if err != nil {
				b.Fatal(err)
			}
			cmd := exec.Command(t.floorBin, "--nats", js.URL, "--stream", js.Stream, "--consumer", js.Consumer, "--dsn", t.dsn,
				"--table", table, "--batch", strconv.Itoa(cfg.Delivery.BatchSize), "--max-wait", cfg.Delivery.MaxWait.String(), "--addr", addr)
			cmd.Args = append(cmd.Args, inboxArgs...)
			cmd.Stdout, cmd.Stderr = logFile, logFile
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			_ = logFile.Close()
			rs.cmds = append(rs.cmds, cmd)
			rs.metrics = append(rs.metrics, "http://"+addr+"/metrics")
			rs.logs = append(rs.logs, logPath)
		}
		b.Cleanup(func() { rs.stop() })
		return rs
	},
		table: "floor_sink", idExpr: "body::jsonb->>'id'", floor: true,
	}
}

// spread is the median of a ratio over interleaved pairs, with each pair's.
type spread []float64

func (s spread) median() float64 {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

// String is "<median> (median of n interleaved pairs, min-max: a-b; pairs: x y z)".
func (s spread) String() string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.2f pairs=%d min=%.2f max=%.2f each=%s", s.median(), len(s), slices.Min(s), slices.Max(s), strings.Join(parts, ","))
}

// headlinePairs is what ceilingPairs measured.
type headlinePairs struct {
	// ceiling and headline are the faster run of each.
	ceiling, headline row
	// ratio is RATIO runtime_vs_db_ceiling: the median of the pairs'.
	ratio float64
	// across is the headline on each other NATS server of the run
	// (PostgreSQL's headline only).
	across []*headlineAcross
}

// rows are the headline rows: the rows' server's, then the others'.
func (p headlinePairs) rows() []row {
	out := []row{p.headline}
	for _, a := range p.across {
		out = append(out, a.best)
	}
	return out
}

// ceilingPairs runs the database ceiling and the headline row (2 x 500)
// interleaved, IDC_BENCH_PAIRS times, on the current sink, and prints
// RATIO runtime_vs_db_ceiling (mariadb_runtime_vs_db_ceiling on MariaDB)
// as the median of the pairs' ratios. On PostgreSQL each pair also runs
// the headline on every other NATS server of the run (natsServers), in
// the order rows' server, other in odd pairs and the reverse in even ones,
// and it prints the RATIO nats_<a>_vs_<b>_… lines (printRatios). It
// returns the faster run of each row, for the lines that use one row, and
// the median.
func (t *throughputEnv) ceilingPairs(b *testing.B) headlinePairs {
	b.Helper()
	p := headlinePairs{across: t.headlinesAcross(b)}
	run := func() row { return t.runJetStream(b, 2, batchSize) }
	var ratios spread
	for i := range envInt(pairsEnv, 3) {
		c := t.dbCeiling(b)
		others := make([]row, len(p.across))
		runOthers := func() {
			for j, a := range p.across {
				t.onNATS(b, a.server, func() { others[j] = run() })
			}
		}
		if i%2 == 1 {
			runOthers()
		}
		h := run()
		if i%2 == 0 {
			runOthers()
		}
		fmt.Printf("PAIR %sruntime_vs_db_ceiling pair=%d db_ceiling_msgs_per_s=%.0f headline_msgs_per_s=%.0f ratio=%.2f\n", t.sink.prefix(), i+1, c.rate(), h.rate(), h.rate()/c.rate())
		ratios = append(ratios, h.rate()/c.rate())
		for j, a := range p.across {
			t.record(a, i, h, others[j])
		}
		if i == 0 {
			p.ceiling, p.headline = c, h
		} else {
			p.ceiling, p.headline = fasterRow(p.ceiling, c), fasterRow(p.headline, h)
		}
	}
	p.headline.name = t.rowName("jetstream_upsert_headline")
	fmt.Printf("RATIO %sruntime_vs_db_ceiling=%s\n", t.sink.prefix(), ratios)
	for _, a := range p.across {
		a.best.name = p.headline.name
		t.printRatios(a)
	}
	p.ratio = ratios.median()
	return p
}

// floorPairs runs the runtime's latency row and the floor consumer's
// (2 x 500, the same producer, stream shape and offered load),
// interleaved, at 10% of jetStreamMax and at 50% of sustained, and
// prints both LATENCY lines of every slice (the fsync probe in each) and
// the RATIO lines: p99 and CPU per message, runtime over floor, the median
// of the pairs.
func (t *throughputEnv) floorPairs(b *testing.B, jetStreamMax, sustained float64) {
	b.Helper()
	saved := t.slice
	t.slice = floorSlice()
	defer func() { t.slice = saved }()
	pairs := envInt(pairsEnv, 3)
	var cpuRatios spread
	for _, p := range []struct {
		name, of   string
		rate, load float64
	}{
		{"10pct", "", 0.1 * jetStreamMax, 0.1},
		{"50pct_of_sustained", "sustained_max", 0.5 * sustained, 0.5},
	} {
		var p99, dedupP99, vsDedupP99 spread
		for i := range pairs {
			rt := t.latencyJetStreamBy(b, "jetstream_upsert_vs_floor", 2, batchSize, config.BatchingAdaptive, p.rate, p.load, runtimeConsumer)
			fl := t.latencyJetStreamBy(b, "floor_consumer", 2, batchSize, config.BatchingAdaptive, p.rate, p.load, floorConsumer)
			dd := t.latencyJetStreamBy(b, "floor_consumer_with_inbox", 2, batchSize, config.BatchingAdaptive, p.rate, p.load, dedupFloorConsumer)
			rt.loadOf, fl.loadOf, dd.loadOf = p.of, p.of, p.of
			fl.note, dd.note = floorNote, dedupNote
			printLatency(rt)
			printLatency(fl)
			printLatency(dd)
			rtCPU, flCPU, ddCPU := cpuPerMsg(rt), cpuPerMsg(fl), cpuPerMsg(dd)
			fmt.Printf("PAIR latency_vs_floor load=%s pair=%d p99_ms=%.1f floor_p99_ms=%.1f ratio=%.2f consumer_us_per_msg=%.2f floor_us_per_msg=%.2f postgres_us_per_msg=%.2f floor_postgres_us_per_msg=%.2f\n",
				p.name, i+1, ms(rt.p99), ms(fl.p99), ms(rt.p99)/ms(fl.p99), rtCPU.consumer, flCPU.consumer, rtCPU.postgres, flCPU.postgres)
			fmt.Printf("PAIR latency_vs_floor_with_inbox load=%s pair=%d p99_ms=%.1f floor_with_inbox_p99_ms=%.1f floor_p99_ms=%.1f ratio=%.2f floor_with_inbox_vs_floor=%.2f floor_with_inbox_postgres_us_per_msg=%.2f\n",
				p.name, i+1, ms(rt.p99), ms(dd.p99), ms(fl.p99), ms(rt.p99)/ms(dd.p99), ms(dd.p99)/ms(fl.p99), ddCPU.postgres)
			p99 = append(p99, ms(rt.p99)/ms(fl.p99))
			dedupP99 = append(dedupP99, ms(dd.p99)/ms(fl.p99))
			vsDedupP99 = append(vsDedupP99, ms(rt.p99)/ms(dd.p99))
			if p.load == 0.5 {
				cpuRatios = append(cpuRatios, rtCPU.consumer/flCPU.consumer)
			}
		}
		fmt.Printf("RATIO latency_p99_vs_floor_%s=%s\n", p.name, p99)
		// How much of that an inbox costs by itself, and how close the
		// runtime is to the least an inbox costs.
		fmt.Printf("RATIO latency_p99_floor_with_inbox_vs_floor_%s=%s\n", p.name, dedupP99)
		fmt.Printf("RATIO latency_p99_vs_floor_with_inbox_%s=%s\n", p.name, vsDedupP99)
	}
	// CPU per message from the 50% slices: at 10% a consumer's polling
	// while idle dominates what a message costs.
	fmt.Printf("RATIO cpu_per_msg_vs_floor=%s (consumer processes, at 50%% of sustained)\n", cpuRatios)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// msgCPU is a latency row's CPU per committed message, in µs.
type msgCPU struct{ consumer, postgres float64 }

func cpuPerMsg(r latencyRow) msgCPU {
	n := r.achieved * r.cpu.wall.Seconds()
	if n <= 0 {
		return msgCPU{}
	}
	return msgCPU{consumer: float64(r.cpu.runtime.Microseconds()) / n, postgres: float64(r.cpu.postgres.Microseconds()) / n}
}
