package benchcontroller

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// buildManager builds cmd/manager as `make build` and the
// image do (static, trimmed, without DWARF), so the memory measured is the
// shipped binary's: a cgo build maps libc and the resolver besides.
func buildManager(b *testing.B, dir string) string {
	b.Helper()
	bin := filepath.Join(dir, "manager")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-w", "-o", bin, "github.com/idempotency-dev/idc-operator/cmd/manager")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("while building the manager: %v\n%s", err, out)
	}
	return bin
}

// managerProcess is the manager running as a subprocess.
type managerProcess struct {
	cmd     *exec.Cmd
	logPath string
	metrics string        // host:port of the plain-HTTP metrics endpoint
	pprof   string        // host:port of /debug/pprof
	done    chan struct{} // closed when the process exited
	waitErr error
}

func freePort(b *testing.B) int {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startManager runs bin against kubeconfig and waits for its /readyz. Its
// output goes to logPath. It is stopped with SIGTERM at cleanup.
func startManager(b *testing.B, bin, kubeconfig, logPath string, retentionPeriod time.Duration, extraArgs ...string) *managerProcess {
	b.Helper()
	probe := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	pprof := fmt.Sprintf("127.0.0.1:%d", freePort(b))
	args := append([]string{
		"--pprof-bind-address=" + pprof,
		"--metrics-bind-address=" + metrics,
		"--metrics-secure=false",
		"--health-probe-bind-address=" + probe,
		"--retention-period=" + retentionPeriod.String(),
		"--leader-elect=false",
	}, extraArgs...)
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "RUNTIME_IMAGE=idc-operator:bench")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		b.Fatalf("while starting the manager: %v", err)
	}
	m := &managerProcess{cmd: cmd, logPath: logPath, metrics: metrics, pprof: pprof, done: make(chan struct{})}
	go func() {
		m.waitErr = cmd.Wait()
		logFile.Close()
		close(m.done)
	}()
	b.Cleanup(m.stop)

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-m.done:
			b.Fatalf("the manager exited during startup: %v\n%s", m.waitErr, m.logTail(40))
		default:
		}
		if resp, err := http.Get("http://" + probe + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return m
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("the manager's /readyz on %s did not answer 200 within 60s\n%s", probe, m.logTail(40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// counters sums the manager's own counters by metric name (all label
// values together), read from its metrics endpoint.
func (m *managerProcess) counters(names ...string) (map[string]float64, error) {
	resp, err := http.Get("http://" + m.metrics + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("while reading the manager's metrics: %w", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, n := range names {
			if line == n || strings.HasPrefix(line, n+" ") || strings.HasPrefix(line, n+"{") {
				fields := strings.Fields(line)
				v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
				if err == nil {
					out[n] += v
				}
			}
		}
	}
	return out, sc.Err()
}

// phaseTimes is the manager's time per reconcile phase: "phase total/passes
// (mean)" for each, from idc_controller_phase_duration_seconds.
func (m *managerProcess) phaseTimes() (string, error) {
	resp, err := http.Get("http://" + m.metrics + "/metrics")
	if err != nil {
		return "", fmt.Errorf("while reading the manager's metrics: %w", err)
	}
	defer resp.Body.Close()
	sums, counts := map[string]float64{}, map[string]float64{}
	re := regexp.MustCompile(`^idc_controller_phase_duration_seconds_(sum|count)\{phase="([^"]+)"\} (\S+)$`)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if g := re.FindStringSubmatch(sc.Text()); g != nil {
			v, _ := strconv.ParseFloat(g[3], 64)
			if g[1] == "sum" {
				sums[g[2]] = v
			} else {
				counts[g[2]] = v
			}
		}
	}
	phases := make([]string, 0, len(sums))
	for p := range sums {
		phases = append(phases, p)
	}
	sort.Slice(phases, func(i, j int) bool { return sums[phases[i]] > sums[phases[j]] })
	var sb strings.Builder
	for _, p := range phases {
		mean := 0.0
		if counts[p] > 0 {
			mean = sums[p] / counts[p]
		}
		fmt.Fprintf(&sb, " %s %.1fs/%.0f (%.1fms)", p, sums[p], counts[p], mean*1000)
	}
	return sb.String(), sc.Err()
}

// saveHeapProfile writes the manager's heap profile to path (go tool pprof).
func (m *managerProcess) saveHeapProfile(path string) error {
	resp, err := http.Get("http://" + m.pprof + "/debug/pprof/heap")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// exited reports whether the process is gone.
func (m *managerProcess) exited() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits for the graceful shutdown, then kills.
func (m *managerProcess) stop() {
	if m.exited() {
		return
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(30 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.done
	}
}

// memory returns VmHWM (peak resident set) and VmRSS of the process, in MiB.
func (m *managerProcess) memory() (peak, current float64, err error) {
	kib, err := m.status("VmHWM", "VmRSS")
	if err != nil {
		return 0, 0, err
	}
	return kib["VmHWM"] / 1024, kib["VmRSS"] / 1024, nil
}

// rssParts is the manager's resident memory now, by kind: anonymous (the
// Go heap, stacks and runtime) and file-backed (the binary's pages).
func (m *managerProcess) rssParts() (anon, file float64, err error) {
	kib, err := m.status("RssAnon", "RssFile")
	if err != nil {
		return 0, 0, err
	}
	return kib["RssAnon"] / 1024, kib["RssFile"] / 1024, nil
}

// status reads the named kB fields of the manager's /proc status.
func (m *managerProcess) status(fields ...string) (map[string]float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", m.cmd.Process.Pid))
	if err != nil {
		return nil, fmt.Errorf("while reading the manager's /proc status: %w", err)
	}
	kib := map[string]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !slices.Contains(fields, k) {
			continue
		}
		f := strings.Fields(v) // "123456 kB"
		if len(f) == 2 && f[1] == "kB" {
			kib[k], _ = strconv.ParseFloat(f[0], 64)
		}
	}
	for _, k := range fields {
		if _, ok := kib[k]; !ok {
			return nil, fmt.Errorf("no %s in the manager's /proc status", k)
		}
	}
	return kib, nil
}

// cpuSeconds is the user+system CPU time the process used so far.
func (m *managerProcess) cpuSeconds() (float64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("while reading the manager's /proc stat: %w", err)
	}
	// Fields after the parenthesised command: state is field 3, utime 14, stime 15.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / clockTicks, nil
}

// clockTicks is USER_HZ, 100 on Linux for every architecture Go supports.
const clockTicks = 100

func (m *managerProcess) logTail(n int) string {
	raw, err := os.ReadFile(m.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// resourceNameRE folds the per-resource names out of log messages so that
// identical errors on different resources group together.
var resourceNameRE = regexp.MustCompile(`bench-\d{4}|inbox_bench_\d{4}\w*`)

// logSummary groups the manager's error-level log lines by message and
// error text, most frequent first.
func (m *managerProcess) logSummary() (string, error) {
	f, err := os.Open(m.logPath)
	if err != nil {
		return "", err
	}
	defer f.Close()
	counts := map[string]int{}
	lines := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines++
		var entry struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Error string `json:"error"`
		}
		if json.Unmarshal(sc.Bytes(), &entry) != nil || entry.Level != "error" {
			continue
		}
		counts[entry.Msg+": "+resourceNameRE.ReplaceAllString(entry.Error, "<name>")]++
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d log lines, %d distinct errors", lines, len(keys))
	for _, k := range keys {
		fmt.Fprintf(&sb, "\n  %5d  %s", counts[k], k)
	}
	return sb.String(), nil
}
