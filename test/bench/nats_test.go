package bench

import (
	"bufio"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
)

// The NATS servers of a run. TestMain starts the current nats-server (the
// release hack/build-nats.sh builds, `make nats`) on a port of its own and
// connects to the machine's (Debian's 2.9.10 on 127.0.0.1:4222, the oldest
// supported); IDC_TEST_NATS=current or system keeps one of them. Every
// JetStream row runs on the first (natsURL). The rows compared across
// versions run on each server (otherNATS): the headline 2 x 500 row in
// ceilingPairs' pairs, and the latency rows at 10% and at 50% of
// sustained, each right after the first server's (jetStreamLatencyRows);
// their lines
// carry nats=<version>, and RATIO nats_<a>_vs_<b>_… lines (a the first
// server's major.minor, b the other's) compare them.
var (
	natsServers []*natstest.Server
	// natsURL is the first server's: where every JetStream row runs
	// unless a row is compared across versions.
	natsURL string
)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		// No benchmark selected: `make test` runs this package's test
		// binary (it has no tests), which needs no server. A test added
		// here that needs NATS moves this line.
		os.Exit(m.Run())
	}
	os.Exit(natstest.Main(m, natstest.Both, func(s []*natstest.Server) error {
		natsServers = s
		natsURL = s[0].URL
		return nil
	}))
}

// natsConn is the benchmark's connection to one NATS server and what the
// environment published there.
type natsConn struct {
	server *natstest.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	// stream is the workload's stream on this server (jetStreamStream).
	stream string
	// pid is the server's process (0 when it could not be found): the
	// CPU lines' nats= is its CPU, not that of every nats-server on the
	// machine (the other server of the run, other suites' servers).
	pid int
}

func (c *natsConn) url() string     { return c.server.URL }
func (c *natsConn) version() string { return c.server.Version }

// natsConnTo opens (once per environment) the connection to s.
func (t *throughputEnv) natsConnTo(b *testing.B, s *natstest.Server) *natsConn {
	b.Helper()
	if c, ok := t.natsConns[s]; ok {
		return c
	}
	c := &natsConn{server: s}
	var err error
	if c.nc, err = nats.Connect(s.URL); err != nil {
		b.Fatalf("NATS JetStream %s at %s is required for the benchmark: %v", s.Version, s.URL, err)
	}
	b.Cleanup(c.nc.Close)
	if c.js, err = jetstream.New(c.nc, jetstream.WithPublishAsyncMaxPending(4000)); err != nil {
		b.Fatal(err)
	}
	if c.pid, err = listenerPID(s.URL); err != nil {
		// The CPU lines then count every nats-server process, as they
		// did before the run had two.
		fmt.Printf("NOTE nats-server %s at %s: its process not found (%v); the CPU lines' nats= counts every nats-server process\n",
			s.Version, s.URL, err)
	}
	t.natsConns[s] = c
	return c
}

// onNATS runs fn with the JetStream rows on s, then puts the environment's
// server back.
func (t *throughputEnv) onNATS(b *testing.B, s *natstest.Server, fn func()) {
	b.Helper()
	saved := t.nats
	t.nats = t.natsConnTo(b, s)
	defer func() { t.nats = saved }()
	fn()
}

// otherNATS are the run's servers other than the rows' own, on which the
// rows compared across versions run again.
func (t *throughputEnv) otherNATS() []*natstest.Server {
	var out []*natstest.Server
	for _, s := range natsServers {
		if s != t.nats.server {
			out = append(out, s)
		}
	}
	return out
}

// natsVs names a comparison of the rows' server with other:
// "nats_2.15_vs_2.9" (major.minor of each; the ratio is the rows' server's
// figure over other's).
func (t *throughputEnv) natsVs(other *natstest.Server) string {
	return "nats_" + majorMinor(t.nats.version()) + "_vs_" + majorMinor(other.Version)
}

func majorMinor(v string) string {
	if parts := strings.SplitN(v, ".", 3); len(parts) >= 2 {
		return parts[0] + "." + parts[1]
	}
	return v
}

// headlineAcross is the headline row on another NATS server, measured in
// ceilingPairs' pairs.
type headlineAcross struct {
	server *natstest.Server
	// best is its faster run, printed as the row.
	best row
	// msgs, runtimeCPU and natsCPU are, per pair, the rows' server's
	// msg/s and CPU per message (the replicas', the server's) over this
	// server's.
	msgs, runtimeCPU, natsCPU spread
}

// usPerMsg is d per message of the row in µs (0 without CPU figures).
func (r row) usPerMsg(d func(*cpuUse) float64) float64 {
	if r.cpu == nil || r.msgs == 0 {
		return 0
	}
	return d(r.cpu) / float64(r.msgs)
}

func runtimeUS(c *cpuUse) float64 { return float64(c.runtime.Microseconds()) }
func natsUS(c *cpuUse) float64    { return float64(c.nats.Microseconds()) }

// headlinesAcross publishes the workload on every other server, so that no
// headline row there is timed while the server writes a fresh stream.
func (t *throughputEnv) headlinesAcross(b *testing.B) []*headlineAcross {
	b.Helper()
	if _, pg := t.sink.(pgSink); !pg {
		return nil // the headline compared across versions is PostgreSQL's
	}
	var out []*headlineAcross
	for _, s := range t.otherNATS() {
		t.onNATS(b, s, func() { t.jetStreamStream(b) })
		out = append(out, &headlineAcross{server: s})
	}
	return out
}

// record adds pair i: h on the rows' server, o on a's; it prints the
// pair's PAIR line.
func (t *throughputEnv) record(a *headlineAcross, i int, h, o row) {
	if i == 0 {
		a.best = o
	} else {
		a.best = fasterRow(a.best, o)
	}
	a.msgs = append(a.msgs, h.rate()/o.rate())
	a.runtimeCPU = append(a.runtimeCPU, h.usPerMsg(runtimeUS)/o.usPerMsg(runtimeUS))
	a.natsCPU = append(a.natsCPU, h.usPerMsg(natsUS)/o.usPerMsg(natsUS))
	cur, other := t.nats.version(), a.server.Version
	fmt.Printf("PAIR %s_headline pair=%d nats_%s_msgs_per_s=%.0f nats_%s_msgs_per_s=%.0f ratio=%.2f "+
		"nats_%s_idc_runtime_us_per_msg=%.2f nats_%s_idc_runtime_us_per_msg=%.2f nats_%s_server_us_per_msg=%.2f nats_%s_server_us_per_msg=%.2f\n",
		t.natsVs(a.server), i+1, cur, h.rate(), other, o.rate(), h.rate()/o.rate(),
		cur, h.usPerMsg(runtimeUS), other, o.usPerMsg(runtimeUS), cur, h.usPerMsg(natsUS), other, o.usPerMsg(natsUS))
}

// printRatios prints the headline's RATIO lines against a's server: msg/s,
// the replicas' CPU per message and the NATS server's, each the median of
// the pairs.
func (t *throughputEnv) printRatios(a *headlineAcross) {
	vs := t.natsVs(a.server)
	fmt.Printf("RATIO %s_headline=%s (msg/s, 2 x 500, nats-server %s over %s)\n", vs, a.msgs, t.nats.version(), a.server.Version)
	fmt.Printf("RATIO %s_cpu_per_msg=%s (idc_runtime µs per message, headline rows)\n", vs, a.runtimeCPU)
	fmt.Printf("RATIO %s_server_cpu_per_msg=%s (the nats-server's own µs per message, headline rows)\n", vs, a.natsCPU)
}

// latencyAcross runs a JetStream latency row again on every other server
// at r's offered rate (run is the row), prints its LATENCY line and
// RATIO <natsVs>_latency_p99_<what>: r's p99 over the other's.
func (t *throughputEnv) latencyAcross(b *testing.B, what string, r latencyRow, run func() latencyRow) {
	b.Helper()
	for _, s := range t.otherNATS() {
		var o latencyRow
		t.onNATS(b, s, func() { o = run() })
		printLatency(o)
		fmt.Printf("RATIO %s_latency_p99_%s=%.2f (p99 %.1f ms on %s, %.1f ms on %s; offered %.0f and %.0f msg/s, achieved %.0f and %.0f)\n",
			t.natsVs(s), what, ms(r.p99)/ms(o.p99), ms(r.p99), r.nats, ms(o.p99), o.nats, r.offered, o.offered, r.achieved, o.achieved)
	}
}

// listenerPID is the process listening on the TCP port of a nats:// URL,
// read from /proc (the sockets in /proc/net/tcp*, then the process whose
// descriptors hold one).
func listenerPID(natsURL string) (int, error) {
	u, err := url.Parse(natsURL)
	if err != nil {
		return 0, err
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return 0, fmt.Errorf("no port in %s", natsURL)
	}
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" { // 0A: LISTEN
				continue
			}
			_, hexPort, ok := strings.Cut(fields[1], ":")
			if p, err := strconv.ParseInt(hexPort, 16, 32); ok && err == nil && int(p) == port {
				inodes["socket:["+fields[9]+"]"] = true
			}
		}
		_ = f.Close()
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("no listening socket on port %d in /proc/net/tcp", port)
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil && inodes[link] {
			return strconv.Atoi(strings.Split(fd, "/")[2])
		}
	}
	return 0, fmt.Errorf("no process holds the socket listening on port %d (not allowed to read its descriptors?)", port)
}
