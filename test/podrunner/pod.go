package podrunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Phase is a local pod's lifecycle phase, as in corev1.PodPhase.
type Phase string

// Phases.
const (
	PhasePending   Phase = "Pending"
	PhaseRunning   Phase = "Running"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
)

// PodInfo is a snapshot of one local pod.
type PodInfo struct {
	Name        string
	Namespace   string
	Owner       string // "Deployment/name" or "Job/name"
	Labels      map[string]string
	Annotations map[string]string
	// Ports maps each container port name (and number) to its local port on
	// 127.0.0.1.
	Ports    map[string]int
	Phase    Phase
	Ready    bool
	PID      int
	Restarts int
	Failures int
	// LastExit describes how the last process ended; LastError why the last
	// start failed (an unresolvable Secret, say).
	LastExit  string
	LastError string
	LogPath   string
}

// Addr is "127.0.0.1:port" of a container port, "" when the pod has none of
// that name.
func (i PodInfo) Addr(port string) string {
	if p, ok := i.Ports[port]; ok {
		return fmt.Sprintf("127.0.0.1:%d", p)
	}
	return ""
}

// RewriteFunc may change a file materialised from a ConfigMap or Secret
// volume before the process sees it; containerPath is where the container
// would see the file.
type RewriteFunc func(pod PodInfo, containerPath string, content []byte) ([]byte, error)

// podIdentity is a synthesized pod: what never changes over its restarts.
type podIdentity struct {
	name, namespace, uid string
	owner                string
	labels, annotations  map[string]string
	spec                 corev1.PodSpec
	ports                map[string]int
	dir                  string
	logPath              string
}

func (p *podIdentity) info() PodInfo {
	return PodInfo{Name: p.name, Namespace: p.namespace, Owner: p.owner, Labels: p.labels, Annotations: p.annotations,
		Ports: p.ports, LogPath: p.logPath}
}

// podConfig is how a pod is supervised.
type podConfig struct {
	restartPolicy  corev1.RestartPolicy
	backoffLimit   int // failures tolerated before Failed (restartPolicy other than Always)
	initialBackoff time.Duration
	maxBackoff     time.Duration
	probeInterval  time.Duration
	maxGrace       time.Duration
	output         io.Writer
	onChange       func()
	logf           func(msg string, kv ...any)
}

// pod supervises the processes of one local pod.
type pod struct {
	id  *podIdentity
	cfg podConfig
	res *resolver

	mu        sync.Mutex
	phase     Phase
	ready     bool
	pid       int
	restarts  int
	failures  int
	lastExit  string
	lastError string
	stopping  bool

	stopCh chan struct{}
	done   chan struct{}
	log    io.WriteCloser
}

func startPod(ctx context.Context, id *podIdentity, cfg podConfig, res *resolver) (*pod, error) {
	if err := os.MkdirAll(id.dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the pod directory: %w", err)
	}
	f, err := os.OpenFile(id.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the pod log: %w", err)
	}
	p := &pod{id: id, cfg: cfg, res: res, phase: PhasePending, stopCh: make(chan struct{}), done: make(chan struct{}), log: f}
	go p.supervise(ctx)
	return p, nil
}

func (p *pod) snapshot() PodInfo {
	i := p.id.info()
	p.mu.Lock()
	defer p.mu.Unlock()
	i.Phase, i.Ready, i.PID, i.Restarts, i.Failures, i.LastExit, i.LastError = p.phase, p.ready, p.pid, p.restarts, p.failures, p.lastExit, p.lastError
	return i
}

// terminal says whether the pod will not run again.
func (p *pod) terminal() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.phase == PhaseSucceeded || p.phase == PhaseFailed
}

func (p *pod) supervise(ctx context.Context) {
	defer close(p.done)
	defer func() { _ = p.log.Close() }()
	backoff := p.cfg.initialBackoff
	for {
		started := time.Now()
		code, err := p.runOnce(ctx)
		if p.isStopping() || ctx.Err() != nil {
			return
		}
		if p.settle(code, err) {
			p.cfg.onChange()
			return
		}
		p.cfg.onChange()
		if time.Since(started) > 10*p.cfg.maxBackoff {
			backoff = p.cfg.initialBackoff
		}
		if !p.sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, p.cfg.maxBackoff)
	}
}

// settle records an ended attempt and says whether the pod is finished.
func (p *pod) settle(code int, startErr error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ready, p.pid = false, 0
	if startErr != nil {
		// Like CreateContainerConfigError: retried, not counted as a failure.
		p.phase, p.lastError = PhasePending, startErr.Error()
		return false
	}
	p.lastError = ""
	p.lastExit = fmt.Sprintf("exit code %d at %s", code, time.Now().Format(time.RFC3339))
	if p.cfg.restartPolicy == corev1.RestartPolicyAlways {
		p.restarts++
		return false
	}
	if code == 0 {
		p.phase = PhaseSucceeded
		return true
	}
	p.failures++
	if p.failures > p.cfg.backoffLimit {
		p.phase = PhaseFailed
		return true
	}
	p.restarts++
	return false
}

func (p *pod) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.stopCh:
		return false
	case <-ctx.Done():
		return false
	}
}

func (p *pod) isStopping() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopping
}

// runOnce starts the container's process and waits for it. A start that
// cannot happen returns the error and code -1.
func (p *pod) runOnce(ctx context.Context) (int, error) {
	spec, err := p.res.resolve(ctx, p.id, p.id.dir)
	if err != nil {
		p.cfg.logf("cannot start pod", "pod", p.id.name, "error", err.Error())
		_, _ = fmt.Fprintf(p.log, "=== %s cannot start: %v\n", time.Now().Format(time.RFC3339), err)
		return -1, err
	}
	out := io.Writer(p.log)
	if p.cfg.output != nil {
		out = io.MultiWriter(p.log, newPrefixWriter(p.cfg.output, "["+p.id.name+"] "))
	}
	cmd := exec.Command(spec.path, spec.args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOSTNAME=" + p.id.name, "HOME=" + p.id.dir}, spec.env...)
	cmd.Dir = spec.dir
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group: a Ctrl-C in the terminal reaches the runner,
	// which stops the pods gracefully, not the pods directly.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	_, _ = fmt.Fprintf(p.log, "=== %s start: %s %s\n", time.Now().Format(time.RFC3339), filepath.Base(spec.path), strings.Join(spec.args, " "))
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("starting %s: %w", spec.path, err)
	}
	if !p.running(cmd.Process.Pid) {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	}
	p.cfg.onChange()
	probeCtx, cancel := context.WithCancel(ctx)
	go p.probe(probeCtx, &p.id.spec.Containers[0], cmd.Process.Pid)
	err = cmd.Wait()
	cancel()
	code := exitCodeOf(cmd, err)
	_, _ = fmt.Fprintf(p.log, "=== %s exited: code %d\n", time.Now().Format(time.RFC3339), code)
	p.cfg.logf("pod process exited", "pod", p.id.name, "code", code)
	return code, nil
}

// running records the process; false when the pod is being stopped.
func (p *pod) running(pid int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phase, p.pid, p.ready = PhaseRunning, pid, false
	return !p.stopping
}

func exitCodeOf(cmd *exec.Cmd, err error) int {
	if cmd.ProcessState == nil {
		return -1
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return -1
	}
	return cmd.ProcessState.ExitCode()
}

// stop ends the pod like a kubelet: SIGTERM, then SIGKILL after the grace
// period (capped by the runner). It waits for the supervisor to end.
func (p *pod) stop() {
	p.mu.Lock()
	first := !p.stopping
	p.stopping = true
	pid := p.pid
	p.mu.Unlock()
	if first {
		close(p.stopCh)
	}
	if pid != 0 {
		_ = syscall.Kill(-pid, syscall.SIGTERM)
	}
	select {
	case <-p.done:
		return
	case <-time.After(p.gracePeriod()):
	}
	p.mu.Lock()
	pid = p.pid
	p.mu.Unlock()
	if pid != 0 {
		p.cfg.logf("grace period over, killing", "pod", p.id.name)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	<-p.done
}

func (p *pod) gracePeriod() time.Duration {
	g := 30 * time.Second
	if s := p.id.spec.TerminationGracePeriodSeconds; s != nil {
		g = time.Duration(*s) * time.Second
	}
	return min(g, p.cfg.maxGrace)
}

func (p *pod) setReady(ready bool) {
	p.mu.Lock()
	changed := p.ready != ready && p.phase == PhaseRunning
	if changed {
		p.ready = ready
	}
	p.mu.Unlock()
	if changed {
		p.cfg.onChange()
	}
}
