// Package natstest gives the test suites their NATS JetStream servers: the
// current nats-server (built from the Go module proxy by hack/build-nats.sh,
// `make nats`), which a suite starts itself on its own loopback port with its
// own store directory, and the machine's server on 127.0.0.1:4222 (Debian's
// 2.9.10, the oldest supported), which it only connects to. The machine's
// server is never started, stopped or configured from here: other tools use
// it.
//
// IDC_TEST_NATS picks the servers a suite runs against: "current" (the built
// one), "system" (the machine's) or "both"; unset, each suite's default
// (the JetStream conformance suite: both; the others: current).
package natstest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Pick names a set of servers (the values of IDC_TEST_NATS).
type Pick string

const (
	// Current is the nats-server that hack/build-nats.sh builds.
	Current Pick = "current"
	// System is the machine's server on 127.0.0.1:4222.
	System Pick = "system"
	// Both is Current, then System.
	Both Pick = "both"
)

// PickEnv overrides a suite's default Pick.
const PickEnv = "IDC_TEST_NATS"

// SystemURL is the machine's NATS server.
const SystemURL = "nats://127.0.0.1:4222"

// moduleLine is the first line of the repository's go.mod: how the helper
// finds bin/ and hack/ from a test's working directory (its package's).
const moduleLine = "module github.com/idempotency-dev/idc-operator"

// Server is one NATS server with JetStream that a suite runs against.
type Server struct {
	// URL is where it listens.
	URL string
	// Version is what the server says it is (its INFO), e.g. "2.15.3".
	Version string
	// cmd is the process this package started (nil for the machine's).
	cmd *exec.Cmd
	dir string
	// exited is closed once the started process is gone; waitErr is then
	// how it ended.
	exited  chan struct{}
	waitErr error
}

// Name is "nats-" and the version: the name of a subtest per server.
func (s *Server) Name() string { return "nats-" + s.Version }

// Started says the server is one this package started (not the machine's).
func (s *Server) Started() bool { return s.cmd != nil }

// Main is a TestMain's body: it starts (or connects to) the servers
// IDC_TEST_NATS picks, def when unset, hands them to set before the tests
// run (an error from set fails the run), runs them, stops what it started
// and returns the exit code. A server that cannot be had fails the run: the
// suites never skip.
func Main(m *testing.M, def Pick, set func([]*Server) error) int {
	servers, err := Open(def)
	if err != nil {
		fmt.Fprintln(os.Stderr, "natstest:", err)
		return 1
	}
	defer func() {
		for _, s := range servers {
			if err := s.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "natstest:", err)
			}
		}
	}()
	for _, s := range servers {
		how := "the machine's"
		if s.Started() {
			how = "started for this run"
		}
		fmt.Fprintf(os.Stderr, "natstest: nats-server %s at %s (%s)\n", s.Version, s.URL, how)
	}
	if err := set(servers); err != nil {
		fmt.Fprintln(os.Stderr, "natstest:", err)
		return 1
	}
	return m.Run()
}

// MainOne is Main for a suite that runs against one server at a time (the
// current one unless IDC_TEST_NATS=system): it stores the server's URL in
// *url before the tests run.
func MainOne(m *testing.M, suite string, url *string) int {
	return Main(m, Current, func(s []*Server) error {
		if len(s) != 1 {
			return fmt.Errorf("the %s suite runs against one NATS server at a time: %s=current or system", suite, PickEnv)
		}
		*url = s[0].URL
		return nil
	})
}

// Open starts or connects to the servers IDC_TEST_NATS picks (def when it
// is unset). The caller stops them.
func Open(def Pick) ([]*Server, error) {
	pick := Pick(os.Getenv(PickEnv))
	if pick == "" {
		pick = def
	}
	var servers []*Server
	add := func(open func() (*Server, error)) error {
		s, err := open()
		if err != nil {
			for _, o := range servers {
				_ = o.Stop()
			}
			return err
		}
		servers = append(servers, s)
		return nil
	}
	switch pick {
	case Current:
		return servers, add(StartCurrent)
	case System:
		return servers, add(OpenSystem)
	case Both:
		if err := add(StartCurrent); err != nil {
			return nil, err
		}
		return servers, add(OpenSystem)
	default:
		return nil, fmt.Errorf("%s=%q: want %s, %s or %s", PickEnv, pick, Current, System, Both)
	}
}

// OpenSystem is the machine's server: it must be up (make services).
func OpenSystem() (*Server, error) {
	v, err := serverVersion(SystemURL, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("the machine's NATS JetStream at %s is required (make services): %w", SystemURL, err)
	}
	return &Server{URL: SystemURL, Version: v}, nil
}

// StartCurrent starts the built nats-server (building it first when it is
// missing or stale) with JetStream on a free loopback port, its store in a
// new temporary directory, and waits until JetStream answers.
func StartCurrent() (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idc-natstest-")
	if err != nil {
		return nil, err
	}
	s, err := start(bin, dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// Binary is the path of the built nats-server: IDC_TEST_NATS_SERVER when
// set, else what hack/build-nats.sh prints (it builds only when needed).
func Binary() (string, error) {
	if p := os.Getenv("IDC_TEST_NATS_SERVER"); p != "" {
		return p, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, "hack", "build-nats.sh"))
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building nats-server (hack/build-nats.sh, make nats): %w\n%s", err, stderr.String())
	}
	return filepath.Join(strings.TrimSpace(string(out)), "nats-server"), nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), moduleLine+"\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("the repository root (its go.mod) is not above the working directory")
		}
		dir = parent
	}
}

// startTimeout bounds the wait for a started server to answer.
const startTimeout = 30 * time.Second

func start(bin, dir string) (*Server, error) {
	store := filepath.Join(dir, "jetstream")
	ports := filepath.Join(dir, "ports")
	if err := os.MkdirAll(ports, 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "nats-server.log"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }() // the child has its own descriptor
	// -p -1: a random free port, which the server writes to its ports
	// file. No cluster, no monitoring port, nothing on :4222.
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", store,
		"--ports_file_dir", ports, "-n", "idc-natstest")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// The server dies with the test binary, even when that is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s := &Server{cmd: cmd, dir: dir, exited: make(chan struct{})}
	go func() { s.waitErr = cmd.Wait(); close(s.exited) }()
	url, err := s.waitReady(ports)
	if err != nil {
		_ = s.Stop()
		log, _ := os.ReadFile(filepath.Join(dir, "nats-server.log"))
		return nil, fmt.Errorf("nats-server %s did not come up: %w\n%s", bin, err, log)
	}
	s.URL = url
	return s, nil
}

// waitReady waits for the ports file, then for JetStream to answer.
func (s *Server) waitReady(portsDir string) (string, error) {
	deadline := time.Now().Add(startTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return "", fmt.Errorf("it exited: %w", s.waitErr)
		case <-time.After(20 * time.Millisecond):
		}
		url, err := readPorts(portsDir)
		if err != nil {
			last = err
			continue
		}
		v, err := serverVersion(url, time.Second)
		if err != nil {
			last = err
			continue
		}
		s.Version = v
		return url, nil
	}
	return "", fmt.Errorf("not ready within %s: %w", startTimeout, last)
}

// readPorts reads the client URL from the server's ports file.
func readPorts(dir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.ports"))
	if err != nil || len(files) == 0 {
		return "", errors.New("no ports file yet")
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		return "", err
	}
	var p struct {
		Nats []string `json:"nats"`
	}
	if err := json.Unmarshal(b, &p); err != nil || len(p.Nats) == 0 {
		return "", fmt.Errorf("ports file %s not complete yet", files[0])
	}
	return p.Nats[0], nil
}

// serverVersion connects, checks that JetStream answers, and returns the
// version the server's INFO names.
func serverVersion(url string, timeout time.Duration) (string, error) {
	nc, err := nats.Connect(url, nats.Timeout(timeout), nats.Name("idc-natstest"))
	if err != nil {
		return "", err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return "", fmt.Errorf("JetStream does not answer at %s: %w", url, err)
	}
	return nc.ConnectedServerVersion(), nil
}

// stopTimeout bounds a started server's graceful shutdown.
const stopTimeout = 10 * time.Second

// Stop stops a server this package started and removes its store; the
// machine's server is left alone.
func (s *Server) Stop() error {
	if s.cmd == nil {
		return nil
	}
	defer func() { _ = os.RemoveAll(s.dir) }()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited: // its exit status after SIGTERM says nothing
		return nil
	case <-time.After(stopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("nats-server (pid %d) did not stop within %s of SIGTERM; killed", s.cmd.Process.Pid, stopTimeout)
	}
}

// Each runs fn as a subtest per server, named by the server's version
// (nats-2.15.3, nats-2.9.10).
func Each(t *testing.T, servers []*Server, fn func(t *testing.T, s *Server)) {
	t.Helper()
	if len(servers) == 0 {
		t.Fatal("natstest: no NATS server (TestMain did not call natstest.Main)")
	}
	for _, s := range servers {
		t.Run(s.Name(), func(t *testing.T) { fn(t, s) })
	}
}
