package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

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
	nc, err := nats.Connect(t.nats.url())
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
