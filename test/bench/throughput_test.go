package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const (
	amqpURI    = "amqp://guest:guest@127.0.0.1:5672/"
	amqpURIEnv = "IDC_BENCH_AMQP_URI"
	redisAddr  = "127.0.0.1:6379"
	dsnEnv     = "IDC_POSTGRES_DSN"

	// ceilingConns is how many connections drive the database ceiling.
	ceilingConns = 4
	// rowTimeout bounds one row of the table.
	rowTimeout = 4 * time.Minute
	// pollEvery is how often the replicas' idc_messages_total is read:
	// often enough to time a 2 s row to about 1%, rarely enough that the
	// scrapes (the process collector reads /proc) stay out of the profile.
	pollEvery = 25 * time.Millisecond
	// maxPollEvery bounds measure's sleep far from a row's end.
	maxPollEvery = 250 * time.Millisecond
)

// BenchmarkThroughput prints the throughput table of `make bench`, every
// row measured in this one run: the database ceiling (the claim + upsert SQL
// driven from Go, no broker), the idc-runtime binary as separate processes
// (as pods run it) for JetStream at replicas {1,2,4,8} x batchSize {100,500,
// 2000}, RabbitMQ, Redis Streams and Kafka (kfake) at 2 replicas each next
// to the broker alone (consume + ack, no database), peak RSS per replica,
// and the RATIO lines; then the MariaDB rows (mariaDBRows).
func BenchmarkThroughput(b *testing.B) {
	w := newWorkload()
	t := newThroughputEnv(b, w)
	if only := os.Getenv(rowsEnv); only != "" {
		t.runSelected(b, only)
		return
	}
	for range b.N {
		// The broker alone first: it also publishes the stream every
		// JetStream row reads, so no row is timed while NATS still writes
		// the fresh stream to disk.
		jsAlone := t.jetStreamAlone(b, 2)
		printRow(jsAlone)
		// The matrix runs twice and every row keeps its better run: on two
		// shared cores a burst of other work during one run of a 1-2 s row
		// would otherwise decide the scale-out and matrix lines.
		type cell struct{ replicas, batch int }
		var order []cell
		matrix := map[cell]row{}
		for range 2 {
			for _, batch := range []int{100, 500, 2000} {
				for _, replicas := range []int{1, 2, 4, 8} {
					c := cell{replicas, batch}
					r := t.runJetStream(b, replicas, batch)
					if prev, ok := matrix[c]; ok {
						r = fasterRow(prev, r)
					} else {
						order = append(order, c)
					}
					matrix[c] = r
				}
			}
		}
		best := map[int]float64{}
		scale := map[int]float64{}
		for _, c := range order {
			r := matrix[c]
			printRow(r)
			if c.batch == 500 {
				printLocks(r)
			}
			best[c.replicas] = max(best[c.replicas], r.rate())
			if c.batch == 500 {
				scale[c.replicas] = r.rate()
			}
		}
		// Scaling out on shared keys without row-lock waits: the stream
		// partitioned by key, one consumer per partition (the better of
		// two runs each, as the matrix).
		parted := map[int]row{}
		for range 2 {
			for _, parts := range []int{4, 8} {
				r := t.runJetStreamPartitioned(b, parts, 500)
				if prev, ok := parted[parts]; ok {
					r = fasterRow(prev, r)
				}
				parted[parts] = r
			}
		}
		for _, parts := range []int{4, 8} {
			printRow(parted[parts])
			printLocks(parted[parts])
		}
		// The two rows of the headline ratio run interleaved (ceiling,
		// runtime, ceiling, runtime, ...; IDC_BENCH_PAIRS pairs), and the
		// ratio is the median of the pairs': the ceiling alone moved by
		// ±25% between runs minutes apart. Each row printed is its
		// faster run.
		// The headline also runs with batching Fixed (an idle fetch waits
		// for a whole batch: the loop before adaptive batching), the
		// better of two, for the side-by-side row.
		// The headline also runs on every other NATS server of the run
		// (the machine's 2.9.10 beside the current release), in the same
		// pairs: RATIO nats_<a>_vs_<b>_headline and _cpu_per_msg.
		hp := t.ceilingPairs(b)
		ceiling, headline, ceilingRatio := hp.ceiling, hp.headline, hp.ratio
		fixed := t.runJetStreamWith(b, 2, 500, config.BatchingFixed)
		fixed = fasterRow(fixed, t.runJetStreamWith(b, 2, 500, config.BatchingFixed))
		printRow(ceiling)
		for _, r := range hp.rows() {
			printRow(r)
		}
		fixed.name = "jetstream_upsert_headline_fixed"
		printRow(fixed)
		// The scale-out and matrix lines use the matrix rows only: every
		// cell the better of the same two runs (folding the headline's two
		// extra runs into the 2-replica cell biased it upwards).
		printCPU(jsAlone)
		printCPU(ceiling)
		for _, r := range hp.rows() {
			printCPU(r)
		}
		printCPU(fixed)

		rabbitAlone := t.rabbitAlone(b, 2)
		printRow(rabbitAlone)
		rabbit := t.runRabbitMQ(b, 2, 500)
		printRow(rabbit)
		printCPU(rabbit)
		printRow(t.redisAlone(b, 2))
		redisRow := t.runRedis(b, 2, 500)
		printRow(redisRow)
		kafkaRow := t.runKafka(b, 2, 500)
		printRow(kafkaRow)

		sustained := t.latencyRows(b, headline.rate(), rabbit.rate(), redisRow.rate(), kafkaRow.rate())
		t.floorPairs(b, headline.rate(), sustained)

		fmt.Printf("RATIO adaptive_vs_fixed_headline=%.2f\n", headline.rate()/fixed.rate())
		fmt.Printf("RATIO rabbitmq_upsert_vs_alone=%.2f\n", rabbit.rate()/rabbitAlone.rate())
		fmt.Printf("SCALEOUT batch=500 replicas_1=%.0f replicas_2=%.0f replicas_4=%.0f replicas_8=%.0f (4 and 8 vs 2: %.2f %.2f)\n",
			scale[1], scale[2], scale[4], scale[8], scale[4]/scale[2], scale[8]/scale[2])
		fmt.Printf("SCALEOUT_PARTITIONED batch=500 partitions_4=%.0f partitions_8=%.0f (vs 2 replicas on one consumer: %.2f %.2f; lock waits at 8: %d partitioned, %d on one consumer)\n",
			parted[4].rate(), parted[8].rate(), parted[4].rate()/scale[2], parted[8].rate()/scale[2],
			parted[8].locks.waits, matrix[cell{8, 500}].locks.waits)
		worst := 1.0
		for _, c := range order {
			worst = min(worst, matrix[c].rate()/best[c.replicas])
		}
		fmt.Printf("MATRIX worst_row_vs_best_at_same_replicas=%.2f\n", worst)
		b.ReportMetric(ceilingRatio, "runtime_vs_db_ceiling")

		// The MariaDB rows last, so that no PostgreSQL row shares the
		// disk with MariaDB's background flushing.
		b.ReportMetric(t.mariaDBRows(b), "mariadb_runtime_vs_db_ceiling")
	}
}

// rowsEnv selects JetStream rows to run instead of the whole table, in
// order, as replicasxbatch items (IDC_BENCH_ROWS=2x500,8x500,8x100): a quick
// way to reproduce one row or compare two side by side. Named items run a
// group: latency, latency-rabbitmq, latency-redis, latency-kafka,
// rabbitmq, fixed; ceiling (the DB ceiling and the headline interleaved,
// the headline on every NATS server of the run), nats (ceiling, then the
// latency rows run on every NATS server: 10% and 50% of sustained),
// mariadb (the MariaDB rows: mariaDBRows),
// floor (the floor consumer's latency rows alone) and latency-floor (the
// runtime's latency rows and the floor consumer's, interleaved).
const rowsEnv = "IDC_BENCH_ROWS"

func (t *throughputEnv) runSelected(b *testing.B, only string) {
	b.Helper()
	jsAlone := t.jetStreamAlone(b, 2) // publishes the stream
	printRow(jsAlone)
	for _, item := range strings.Split(only, ",") {
		switch strings.TrimSpace(item) {
		case "ceiling":
			// The database ceiling and the headline, interleaved, with
			// RATIO runtime_vs_db_ceiling (the median of the pairs).
			hp := t.ceilingPairs(b)
			printHeadlinePairs(hp)
			continue
		case "mariadb":
			// The MariaDB rows: ceiling and headline interleaved, per
			// message, and their RATIO lines.
			t.mariaDBRows(b)
			continue
		case "floor":
			// The floor consumers' latency rows alone (without and with
			// an inbox), at 10% and 50% of a 2 x 500 row measured here
			// (no runtime row beside them).
			r := t.runJetStream(b, 2, batchSize)
			printRow(r)
			for _, load := range []float64{0.1, 0.5} {
				fl := t.latencyJetStreamBy(b, "floor_consumer", 2, batchSize, config.BatchingAdaptive, load*r.rate(), load, floorConsumer)
				fl.note = floorNote
				printLatency(fl)
				dd := t.latencyJetStreamBy(b, "floor_consumer_with_inbox", 2, batchSize, config.BatchingAdaptive, load*r.rate(), load, dedupFloorConsumer)
				dd.note = dedupNote
				printLatency(dd)
			}
			continue
		case "latency-floor":
			// The runtime's latency rows and the floor consumer's,
			// interleaved, at 10% of a 2 x 500 row measured here and at
			// 50% of what a 90% row sustains, with the RATIO lines.
			r := t.runJetStream(b, 2, batchSize)
			printRow(r)
			ninety := t.latencyJetStream(b, 2, batchSize, config.BatchingAdaptive, 0.9*r.rate(), 0.9)
			printLatency(ninety)
			sustained := r.rate()
			if ninety.achieved < 0.95*ninety.offered {
				sustained = ninety.achieved
			}
			fmt.Printf("RATIO latency_sustained_vs_backlog_max=%.2f\n", sustained/r.rate())
			t.floorPairs(b, r.rate(), sustained)
			continue
		}
		if strings.TrimSpace(item) == "nats" {
			// The rows run on every NATS server of the run: the ceiling
			// and headline pairs, then the latency rows at 10% of the
			// headline and at 50% of what a 90% row sustains, with the
			// RATIO nats_<a>_vs_<b>_… lines.
			hp := t.ceilingPairs(b)
			printHeadlinePairs(hp)
			t.jetStreamLatencyRows(b, hp.headline.rate(), []latencyPoint{{0.1, config.BatchingAdaptive}, {0.9, config.BatchingAdaptive}})
			continue
		}
		if strings.TrimSpace(item) == "latency" {
			// The JetStream latency rows, at the shares of a 2 x 500 row
			// measured here.
			r := t.runJetStream(b, 2, 500)
			printRow(r)
			printCPU(r)
			t.latencyRows(b, r.rate(), 0, 0, 0)
			continue
		}
		if item := strings.TrimSpace(item); item == "latency-rabbitmq" || item == "latency-redis" || item == "latency-kafka" {
			// One broker's latency row at 50% of its own 2 x 500 row,
			// measured here first.
			var r row
			var rates [3]float64
			switch item {
			case "latency-rabbitmq":
				r = t.runRabbitMQ(b, 2, 500)
				rates[0] = r.rate()
			case "latency-redis":
				r = t.runRedis(b, 2, 500)
				rates[1] = r.rate()
			default:
				r = t.runKafka(b, 2, 500)
				rates[2] = r.rate()
			}
			printRow(r)
			printCPU(r)
			t.brokerLatencyRows(b, rates[0], rates[1], rates[2])
			continue
		}
		if strings.TrimSpace(item) == "rabbitmq" {
			// RabbitMQ alone and RabbitMQ -> upsert, with their ratio.
			alone := t.rabbitAlone(b, 2)
			printRow(alone)
			printCPU(alone)
			r := t.runRabbitMQ(b, 2, 500)
			printRow(r)
			printCPU(r)
			fmt.Printf("RATIO rabbitmq_upsert_vs_alone=%.2f\n", r.rate()/alone.rate())
			continue
		}
		if strings.TrimSpace(item) == "fixed" {
			r := t.runJetStreamWith(b, 2, 500, config.BatchingFixed)
			r.name = "jetstream_upsert_fixed"
			printRow(r)
			printCPU(r)
			continue
		}
		// <replicas>x<batch>[@base][:NAME=VALUE]: @base runs the binary
		// IDC_BENCH_BASELINE_BIN names (an earlier build, for a before /
		// after in one run); NAME=VALUE is an environment variable for the
		// replicas, e.g. 2x500:GOGC=100.
		spec, env, _ := strings.Cut(strings.TrimSpace(item), ":")
		spec, base := strings.CutSuffix(spec, "@base")
		if base {
			bin := os.Getenv(baselineEnv)
			if bin == "" {
				b.Fatalf("%s: %q needs %s", rowsEnv, item, baselineEnv)
			}
			saved := t.bin
			t.bin = bin
			r := t.runJetStreamEnv(b, 0, 0, "", "@"+spec)
			t.bin = saved
			r.name += "_baseline"
			printRow(r)
			printCPU(r)
			continue
		}
		if p, ok := strings.CutSuffix(spec, "p"); ok {
			// <parts>x<batch>p: the key-partitioned row.
			var parts, batch int
			if _, err := fmt.Sscanf(p, "%dx%d", &parts, &batch); err != nil || parts < 1 || batch < 1 {
				b.Fatalf("%s: %q is not <partitions>x<batch>p", rowsEnv, item)
			}
			r := t.runJetStreamPartitioned(b, parts, batch)
			printRow(r)
			printCPU(r)
			continue
		}
		var replicas, batch int
		if _, err := fmt.Sscanf(spec, "%dx%d", &replicas, &batch); err != nil || replicas < 1 || batch < 1 {
			b.Fatalf("%s: %q is not <replicas>x<batch>[:NAME=VALUE]", rowsEnv, item)
		}
		var r row
		if env != "" {
			r = t.runJetStreamEnv(b, replicas, batch, config.BatchingAdaptive, env)
			r.name += "_" + strings.ToLower(strings.ReplaceAll(env, "=", ""))
		} else {
			r = t.runJetStream(b, replicas, batch)
		}
		printRow(r)
		printCPU(r)
	}
}

// printHeadlinePairs prints ceilingPairs' rows and their CPU lines.
func printHeadlinePairs(hp headlinePairs) {
	printRow(hp.ceiling)
	for _, r := range hp.rows() {
		printRow(r)
	}
	printCPU(hp.ceiling)
	for _, r := range hp.rows() {
		printCPU(r)
	}
}

func fasterRow(a, b row) row {
	if b.rate() > a.rate() {
		return b
	}
	return a
}

// row is one line of the table.
type row struct {
	name     string
	replicas int
	batch    int
	msgs     int
	elapsed  time.Duration
	rssMiB   float64 // peak RSS of the largest replica; 0 when in-process
	note     string
	// cpu is where the cores went while the row was timed.
	cpu *cpuUse
	// locks is what sampleLockWaits saw during the row (JetStream rows).
	locks lockStats
	// nats is the version of the NATS server a JetStream row ran on ("":
	// another broker, or none).
	nats string
}

func (r row) rate() float64 { return float64(r.msgs) / r.elapsed.Seconds() }

func printRow(r row) {
	rss := "-"
	if r.rssMiB > 0 {
		rss = fmt.Sprintf("%.1f", r.rssMiB)
	}
	note := ""
	if r.nats != "" {
		note = " nats=" + r.nats
	}
	if r.note != "" {
		note += " note=" + strconv.Quote(r.note)
	}
	fmt.Printf("BENCH row=%s replicas=%d batch=%d msgs=%d seconds=%.3f msgs_per_s=%.0f peak_rss_mib_per_replica=%s%s\n",
		r.name, r.replicas, r.batch, r.msgs, r.elapsed.Seconds(), r.rate(), rss, note)
}

func printCPU(r row) {
	if r.cpu != nil {
		per := ""
		if r.msgs > 0 {
			per = " " + r.cpu.perMessage(r.msgs)
		}
		version := ""
		if r.nats != "" {
			// nats_version: the line's nats= is the server's CPU.
			version = " nats_version=" + r.nats
		}
		fmt.Printf("CPU row=%s%s %s%s\n", r.name, version, r.cpu, per)
	}
	printLocks(r)
}
