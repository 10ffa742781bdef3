package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// Scheme knows the core, apps, batch and IdempotentConsumer types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = messagingv1alpha1.AddToScheme(s)
	return s
}

// Binaries are the repository's two programs.
type Binaries struct {
	Manager string
	Runtime string
}

// Build compiles the manager (the repository root) and idc-runtime into
// outDir, as `make build` does. The go tool's output goes to stderr.
func Build(ctx context.Context, outDir string, stderr io.Writer) (Binaries, error) {
	b := Binaries{Manager: filepath.Join(outDir, "manager"), Runtime: filepath.Join(outDir, "idc-runtime")}
	for _, target := range []struct{ out, pkg string }{{b.Manager, "."}, {b.Runtime, "./runtime/cmd/idc-runtime"}} {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", target.out, target.pkg)
		cmd.Dir = testenv.RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = stderr, stderr
		if err := cmd.Run(); err != nil {
			return b, fmt.Errorf("go build %s: %w", target.pkg, err)
		}
	}
	return b, nil
}

// ManagerOptions configures the manager process.
type ManagerOptions struct {
	Binary     string
	Kubeconfig string
	// RetentionPeriod is --retention-period: how often the window is
	// re-derived and the last prune run read back.
	RetentionPeriod time.Duration
	// LogPath receives the manager's output.
	LogPath string
	// ExtraArgs are appended to the manager's flags.
	ExtraArgs []string
}

// Process is a started program.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  *os.File
}

// StartManager runs the real manager binary against the cluster of the
// kubeconfig and waits until its /readyz answers.
func StartManager(ctx context.Context, o ManagerOptions) (*Process, error) {
	probe, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--runtime-image=idc-operator:local",
		"--metrics-bind-address=0",
		"--health-probe-bind-address=" + probe,
		"--leader-elect=false",
		"--retention-period=" + o.RetentionPeriod.String(),
	}
	p, err := startProcess(o.Binary, append(args, o.ExtraArgs...), []string{"KUBECONFIG=" + o.Kubeconfig}, o.LogPath)
	if err != nil {
		return nil, err
	}
	if err := p.waitHTTP(ctx, "http://"+probe+"/readyz", time.Minute); err != nil {
		_ = p.Stop(5 * time.Second)
		return nil, fmt.Errorf("the manager did not become ready (log: %s): %w", o.LogPath, err)
	}
	return p, nil
}

func startProcess(binary string, args, env []string, logPath string) (*Process, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s: %w", binary, err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{}), log: f}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited is closed when the process has ended.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Err is how the process ended; valid after Exited.
func (p *Process) Err() error { return p.err }

func (p *Process) waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("the process exited: %w", p.err)
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer 200 within %s: %w", url, timeout, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop sends SIGTERM and, after timeout, SIGKILL; it returns once the
// process has exited.
func (p *Process) Stop(timeout time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		return errors.New("the process did not stop within the timeout and was killed")
	}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return "127.0.0.1:" + strconv.Itoa(l.Addr().(*net.TCPAddr).Port), nil
}
