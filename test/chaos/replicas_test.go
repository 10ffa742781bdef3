package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/testbin"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const failpointEnv = "IDC_FAILPOINT=after-commit-before-ack"

// binaryEnv names a prebuilt idc-runtime to use instead of building one,
// e.g. a deliberately broken build, to see the checker catch it.
const binaryEnv = "IDC_CHAOS_RUNTIME_BIN"

func buildBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv(binaryEnv); bin != "" {
		t.Logf("using the prebuilt runtime %s=%s", binaryEnv, bin)
		return bin
	}
	return testbin.Build(t, testbin.RuntimePackage, "idc-runtime")
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// replica is one pod of a consumer: a slot that always holds at most one
// running process. Its fields are owned by the driver's goroutine.
type replica struct {
	name string
	cfg  config.Config
	cur  *proc // nil while down
}

// group is the replica's durable consumer.
func (r *replica) group() string { return r.cfg.Source.NATSJetStream.Consumer }

// proc is one run of `idc-runtime run`.
type proc struct {
	rep     *replica
	cmd     *exec.Cmd
	armed   bool // started with the after-commit failpoint
	started time.Time
	base    string // http://host:port of /metrics
	logPath string
	killed  atomic.Bool // the driver sent SIGKILL
	stopped atomic.Bool // the test sent SIGTERM
	exited  chan struct{}
	state   *os.ProcessState
}

func (p *proc) sigkilled() bool {
	ws, ok := p.state.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// fleet starts processes and reports each one's exit on exits.
type fleet struct {
	bin    string
	env    []string // added to the test's environment: the DSN variable
	dir    string   // configs and logs
	exits  chan *proc
	mu     sync.Mutex
	procs  []*proc
	starts int
}

func newFleet(t *testing.T, bin string, env ...string) *fleet {
	f := &fleet{bin: bin, env: env, dir: t.TempDir(), exits: make(chan *proc, 4096)}
	t.Cleanup(f.killAll)
	return f
}

func (f *fleet) start(r *replica, armed bool) (*proc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.starts++
	n := f.starts
	f.mu.Unlock()
	cfg := r.cfg
	cfg.HealthAddr = addr
	b, err := json.Marshal(&cfg)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(f.dir, fmt.Sprintf("%s-%03d.json", r.name, n))
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return nil, err
	}
	p := &proc{rep: r, armed: armed, base: "http://" + addr, exited: make(chan struct{}),
		logPath: filepath.Join(f.dir, fmt.Sprintf("%s-%03d.log", r.name, n))}
	if err := f.launch(p, cfgPath); err != nil {
		return nil, err
	}
	r.cur = p
	return p, nil
}

func (f *fleet) launch(p *proc, cfgPath string) error {
	logFile, err := os.Create(p.logPath)
	if err != nil {
		return err
	}
	p.cmd = exec.Command(f.bin, "run", "--config", cfgPath, "--consumer-name", p.rep.name)
	p.cmd.Env = append(append(os.Environ(), f.env...), "POD_NAME="+p.rep.name)
	if p.armed {
		p.cmd.Env = append(p.cmd.Env, failpointEnv)
	}
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	if err := p.cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("starting %s: %w", p.rep.name, err)
	}
	p.started = time.Now()
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	go func() {
		_ = p.cmd.Wait()
		_ = logFile.Close()
		p.state = p.cmd.ProcessState
		close(p.exited)
		f.exits <- p
	}()
	return nil
}

// killAll is the cleanup of a failed run: nothing may outlive the test.
func (f *fleet) killAll() {
	f.mu.Lock()
	procs := append([]*proc(nil), f.procs...)
	f.mu.Unlock()
	for _, p := range procs {
		if p.alive() {
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
}

// stopAll stops every running process with SIGTERM, as Kubernetes does, and
// checks that each one stopped gracefully (exit 0 after finishing its batch).
func (f *fleet) stopAll(reps []*replica, timeout time.Duration) []error {
	var errs []error
	for _, r := range reps {
		if r.cur != nil && r.cur.alive() {
			r.cur.stopped.Store(true)
			_ = r.cur.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.After(timeout)
	for _, r := range reps {
		if r.cur == nil {
			continue
		}
		select {
		case <-r.cur.exited:
		case <-deadline:
			errs = append(errs, fmt.Errorf("%s did not stop within %s after SIGTERM", r.name, timeout))
			continue
		}
		if err := checkGraceful(r.cur); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func checkGraceful(p *proc) error {
	if p.armed && p.sigkilled() {
		return nil // its failpoint fired on a last batch: counted by the driver
	}
	b, _ := os.ReadFile(p.logPath)
	if p.state.ExitCode() != 0 || !strings.Contains(string(b), `"msg":"Stopped gracefully"`) {
		return fmt.Errorf("%s did not stop gracefully (%s); log tail:\n%s", p.rep.name, p.state, tail(p.logPath, 20))
	}
	return nil
}

// counter reads one counter from the process's /metrics: its one series,
// whatever its labels (the runtime's carry sink_kind).
func (p *proc) counter(ctx context.Context, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		return strconv.ParseFloat(strings.TrimSpace(rest), 64)
	}
	return 0, fmt.Errorf("%s: no %s in /metrics", p.rep.name, name)
}

// tail returns the last n lines of a log file.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// logCounts counts, over every process's log, the lines carrying each of
// the given messages.
func (f *fleet) logCounts(msgs ...string) map[string]int {
	f.mu.Lock()
	procs := append([]*proc(nil), f.procs...)
	f.mu.Unlock()
	out := make(map[string]int, len(msgs))
	for _, p := range procs {
		b, err := os.ReadFile(p.logPath)
		if err != nil {
			continue
		}
		for _, m := range msgs {
			out[m] += strings.Count(string(b), `"msg":"`+m)
		}
	}
	return out
}
