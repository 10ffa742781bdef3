package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// --- the runtime as processes ---

// replicaSet is the idc-runtime processes of one row.
type replicaSet struct {
	cmds    []*exec.Cmd
	metrics []string
	logs    []string
	// cpu is set by measure: the CPU spent from the first settled batch
	// to the last.
	cpu *cpuUse
	// acked, when set, counts the messages the broker has seen
	// acknowledged; measure polls it instead of scraping every replica.
	acked func() int
	// natsPID is the NATS server of the row, whose CPU its lines count.
	natsPID int
}

func (t *throughputEnv) startReplicas(b *testing.B, cfg config.Config, n int, env ...string) *replicaSet {
	b.Helper()
	cfg.Delivery.Replicas = n
	cfgs := make([]config.Config, n)
	for i := range cfgs {
		cfgs[i] = cfg
	}
	return t.startReplicasEach(b, cfgs, env...)
}

// startReplicasEach starts one idc-runtime process per config (replica i
// runs cfgs[i]).
func (t *throughputEnv) startReplicasEach(b *testing.B, cfgs []config.Config, env ...string) *replicaSet {
	b.Helper()
	rs := &replicaSet{natsPID: t.nats.pid}
	for i, cfg := range cfgs {
		addr, err := freeAddr()
		if err != nil {
			b.Fatal(err)
		}
		c := cfg
		c.HealthAddr = addr
		c.Sink.Kind = t.sink.kind()
		data, err := json.Marshal(&c)
		if err != nil {
			b.Fatal(err)
		}
		name := fmt.Sprintf("%s-r%d", cfg.Sink.Schema, i)
		path := filepath.Join(t.dir, name+".json")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			b.Fatal(err)
		}
		logPath := filepath.Join(t.dir, name+".log")
		logFile, err := os.Create(logPath)
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(t.bin, "run", "--config", path, "--consumer-name", name)
		cmd.Env = append(os.Environ(), dsnEnv+"="+t.sink.dsn(), amqpURIEnv+"="+amqpURI)
		// IDC_BENCH_REPLICA_ENV="GOMAXPROCS=1 GOGC=200": for every replica
		// of every row (an A/B of runtime settings against a whole table).
		cmd.Env = append(cmd.Env, strings.Fields(os.Getenv("IDC_BENCH_REPLICA_ENV"))...)
		if dir := os.Getenv("IDC_BENCH_CPU_PROFILES"); dir != "" {
			// A diagnostic: every replica of every row writes a CPU
			// profile (a row's env below may name it more precisely).
			cmd.Env = append(cmd.Env, "IDC_CPU_PROFILE="+filepath.Join(dir, name+".pprof"))
		}
		for _, e := range env {
			cmd.Env = append(cmd.Env, strings.ReplaceAll(e, "{replica}", strconv.Itoa(i)))
		}
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
}

// settled sums idc_messages_total over the replicas (a replica not up yet
// counts 0).
func (rs *replicaSet) settled() int {
	if rs.acked != nil {
		return rs.acked()
	}
	total := 0
	for _, u := range rs.metrics {
		total += scrapeCounter(u, "idc_messages_total")
	}
	return total
}

// commits sums the replicas' transactions and their time in COMMIT so far
// (idc_commit_duration_seconds).
func (rs *replicaSet) commits() (int, float64) {
	n, secs := 0, 0.0
	for _, u := range rs.metrics {
		n += scrapeCounter(u, "idc_commit_duration_seconds_count")
		secs += scrapeFloat(u, "idc_commit_duration_seconds_sum")
	}
	return n, secs
}

// peakRSSMiB is the largest VmHWM (peak resident set) among the replicas.
func (rs *replicaSet) peakRSSMiB() float64 {
	peak := 0.0
	for _, c := range rs.cmds {
		peak = max(peak, vmHWM(c.Process.Pid))
	}
	return peak
}

func (rs *replicaSet) stop() {
	for _, c := range rs.cmds {
		if c.ProcessState == nil {
			_ = c.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, c := range rs.cmds {
		if c.ProcessState == nil {
			_ = c.Wait()
		}
	}
}

// measure waits until the replicas settled total messages. It returns the
// messages settled after the first scrape that saw any, the time they took
// (to the scrape that saw the last), and the peak RSS. The processes'
// start-up, connect and migrate are not counted, and neither are the
// batches that had already settled at that first scrape: counting them
// without their time overstated rows whose first round is large (8
// replicas x 2 lanes x batch 2000 settle 32,000 messages at once; such a
// row once printed 166k msg/s, above the database ceiling).
func (rs *replicaSet) measure(b *testing.B, name string, total int) (int, time.Duration, float64) {
	b.Helper()
	deadline := time.Now().Add(rowTimeout)
	var first time.Time
	var before int
	var cpuStart cpuSnapshot
	for {
		n := rs.settled()
		now := time.Now()
		if n > 0 && first.IsZero() {
			first, before = now, n
			cpuStart = takeCPU(rs.natsPID, rs.pids()...)
		}
		if n >= total {
			rs.cpu = cpuSince(cpuStart, rs.pids()...)
			// Over the whole row: scraping at the first poll would cost
			// the timed window a scrape per replica.
			rs.cpu.commits, rs.cpu.commitSeconds = rs.commits()
			rss := rs.peakRSSMiB()
			rs.stop()
			if n == before {
				b.Fatalf("%s: all %d messages settled before the first scrape; nothing was timed", name, n)
			}
			return n - before, now.Sub(first), rss
		}
		if now.After(deadline) {
			b.Fatalf("%s: settled %d of %d messages in %s; logs: %v", name, n, total, rowTimeout, rs.logs)
		}
		for _, c := range rs.cmds {
			if c.ProcessState != nil {
				b.Fatalf("%s: a replica exited: %v; logs: %v", name, c.ProcessState, rs.logs)
			}
		}
		if rs.acked != nil {
			time.Sleep(pollEvery) // a broker request per poll: costs the replicas nothing
		} else {
			time.Sleep(nextPoll(n-before, now.Sub(first), total-n))
		}
	}
}

// nextPoll is how long measure sleeps before it looks again: pollEvery
// near the end, longer (up to maxPollEvery) while half the expected rest
// of the row is longer than that. Rows that count settled messages by
// scraping the replicas' /metrics (RabbitMQ, Redis, Kafka) paid for every
// scrape in the replicas' CPU (the process collector reads /proc: about
// 10% of a RabbitMQ replica's profile with a scrape every 25 ms).
func nextPoll(done int, took time.Duration, left int) time.Duration {
	if done <= 0 || took <= 0 {
		return pollEvery
	}
	rest := time.Duration(float64(left) / float64(done) * float64(took))
	return min(max(rest/2, pollEvery), maxPollEvery)
}
