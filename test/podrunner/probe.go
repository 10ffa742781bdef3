package podrunner

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probeTimeout bounds one probe; probes answer from memory.
const probeTimeout = time.Second

var probeClient = &http.Client{Timeout: probeTimeout}

// probe runs the readiness and liveness probes of a running process until
// ctx ends. Readiness is polled every probeInterval (faster than the
// periodSeconds a kubelet would use, so tests do not wait); liveness keeps its
// declared period and failure threshold and kills the process when it fails.
func (p *pod) probe(ctx context.Context, c *corev1.Container, pid int) {
	if c.ReadinessProbe == nil {
		p.setReady(true)
	}
	live := newLivenessTracker(c.LivenessProbe, time.Now())
	t := time.NewTicker(p.cfg.probeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if c.ReadinessProbe != nil {
				p.setReady(p.check(ctx, c.ReadinessProbe) == nil)
			}
			if live.due(now) && live.record(p.check(ctx, c.LivenessProbe)) {
				p.cfg.logf("liveness probe failed, killing the process", "pod", p.id.name)
				_ = syscall.Kill(-pid, syscall.SIGKILL)
				return
			}
		}
	}
}

// livenessTracker counts consecutive liveness failures at the probe's period.
type livenessTracker struct {
	probe    *corev1.Probe
	next     time.Time
	failures int
}

func newLivenessTracker(probe *corev1.Probe, start time.Time) *livenessTracker {
	l := &livenessTracker{probe: probe}
	if probe != nil {
		l.next = start.Add(time.Duration(probe.InitialDelaySeconds) * time.Second)
	}
	return l
}

func (l *livenessTracker) due(now time.Time) bool {
	if l.probe == nil || now.Before(l.next) {
		return false
	}
	l.next = now.Add(time.Duration(max(l.probe.PeriodSeconds, 1)) * time.Second)
	return true
}

// record says whether the failure threshold is reached.
func (l *livenessTracker) record(err error) bool {
	if err == nil {
		l.failures = 0
		return false
	}
	l.failures++
	return l.failures >= int(max(l.probe.FailureThreshold, 1))
}

// check runs one probe against the pod's local ports.
func (p *pod) check(ctx context.Context, probe *corev1.Probe) error {
	switch {
	case probe.HTTPGet != nil:
		port, err := p.localPort(probe.HTTPGet.Port)
		if err != nil {
			return err
		}
		return httpGet(ctx, fmt.Sprintf("http://127.0.0.1:%d%s", port, probe.HTTPGet.Path))
	case probe.TCPSocket != nil:
		port, err := p.localPort(probe.TCPSocket.Port)
		if err != nil {
			return err
		}
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), probeTimeout)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	// exec and gRPC probes are not modelled: a running process passes.
	return nil
}

func (p *pod) localPort(port intstr.IntOrString) (int, error) {
	key := port.StrVal
	if port.Type == intstr.Int {
		key = strconv.Itoa(port.IntValue())
	}
	local, ok := p.id.ports[key]
	if !ok {
		return 0, fmt.Errorf("probe port %s is not a container port", key)
	}
	return local, nil
}

func httpGet(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// prefixWriter writes whole lines, each prefixed; writers sharing one
// destination are serialised by a lock per destination.
type prefixWriter struct {
	mu     *sync.Mutex
	out    io.Writer
	prefix string
	buf    []byte
}

var (
	outputLocksMu sync.Mutex
	outputLocks   = map[io.Writer]*sync.Mutex{}
)

func newPrefixWriter(out io.Writer, prefix string) *prefixWriter {
	outputLocksMu.Lock()
	defer outputLocksMu.Unlock()
	mu, ok := outputLocks[out]
	if !ok {
		mu = &sync.Mutex{}
		outputLocks[out] = mu
	}
	return &prefixWriter{mu: mu, out: out, prefix: prefix}
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		w.mu.Lock()
		_, err := fmt.Fprintf(w.out, "%s%s\n", w.prefix, w.buf[:i])
		w.mu.Unlock()
		w.buf = w.buf[i+1:]
		if err != nil {
			return len(b), err
		}
	}
}
