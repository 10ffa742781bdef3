package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/testbin"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// TestBinary builds the real idc-runtime and runs it as the Deployment
// would, against JetStream and PostgreSQL.
func TestBinary(t *testing.T) {
	bin := buildBinary(t)
	t.Run("GracefulStopCommitsInFlightWork", func(t *testing.T) { gracefulStop(t, bin) })
	t.Run("DatabaseDownAtStartupRetriesUnready", func(t *testing.T) { databaseDown(t, bin) })
	t.Run("FailpointKillsBetweenCommitAndAck", func(t *testing.T) {
		onEachSink(t, func(t *testing.T, db sinkDB) { failpoint(t, bin, db) })
	})
	t.Run("RelayFailpointKillsBetweenPublishAndMark", func(t *testing.T) { relayFailpoint(t, bin) })
	t.Run("PipelineChaos", func(t *testing.T) {
		onEachSink(t, func(t *testing.T, db sinkDB) { pipelineChaos(t, bin, db) })
	})
	t.Run("HTTPOutbox", func(t *testing.T) { httpOutbox(t, bin) })
	t.Run("OutageLongerThanTheWindow", func(t *testing.T) { outageLongerThanTheWindow(t, bin) })
	t.Run("ConsumerRecreatedDuringTheOutage", func(t *testing.T) { consumerRecreatedDuringTheOutage(t, bin) })
	t.Run("AcksLostOnAHalfOpenConnection", func(t *testing.T) { acksLostOnAHalfOpenConnection(t, bin) })
	t.Run("LeastPrivilegeRole", func(t *testing.T) { leastPrivilege(t, bin) })
	t.Run("InboxLostHolds", func(t *testing.T) { inboxLost(t, bin) })
}

func buildBinary(t *testing.T) string {
	t.Helper()
	return testbin.Build(t, testbin.RuntimePackage, "idc-runtime")
}

// syncBuffer collects the process's log lines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type process struct {
	cmd    *exec.Cmd
	logs   *syncBuffer
	base   string // http://host:port of /metrics, /healthz, /readyz
	exited chan struct{}
	state  *os.ProcessState
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startBinary runs `idc-runtime run --config FILE` with env added to the
// test's environment (which holds the DSN variable).
func startBinary(t *testing.T, bin string, cfg *config.Config, env ...string) *process {
	t.Helper()
	return startRun(t, bin, cfg, "idc-runtime-test-0", []string{"--log-level", "debug"}, env...)
}

// startRun runs `idc-runtime run --config FILE` and args as pod (its
// POD_NAME) with env added to the test's environment; the process is
// killed, and its logs shown on failure, when the test ends.
func startRun(t *testing.T, bin string, cfg *config.Config, pod string, args []string, env ...string) *process {
	t.Helper()
	cfg.HealthAddr = freeAddr(t)
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	p := &process{logs: &syncBuffer{}, base: "http://" + cfg.HealthAddr, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"run", "--config", path}, args...)...)
	p.cmd.Env = append(append(os.Environ(), "POD_NAME="+pod), env...)
	p.cmd.Stdout = p.logs
	p.cmd.Stderr = p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.state = p.cmd.ProcessState
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("idc-runtime %s logs:\n%s", pod, p.logs.String())
		}
	})
	return p
}

func (p *process) get(path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func (p *process) waitStatus(t *testing.T, path string, want int, timeout time.Duration) string {
	t.Helper()
	var body string
	waitFor(t, timeout, fmt.Sprintf("%s to answer %d", path, want), func() error {
		code, b, err := p.get(path)
		if err != nil {
			return err
		}
		if code != want {
			return fmt.Errorf("status %d", code)
		}
		body = b
		return nil
	})
	return body
}

// terminate sends SIGTERM and returns the exit state.
func (p *process) terminate(t *testing.T) *os.ProcessState {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	return p.wait(t, 30*time.Second)
}

func (p *process) wait(t *testing.T, timeout time.Duration) *os.ProcessState {
	t.Helper()
	select {
	case <-p.exited:
		return p.state
	case <-time.After(timeout):
		t.Fatalf("idc-runtime did not exit within %s", timeout)
		return nil
	}
}

func expectCleanExit(t *testing.T, p *process, st *os.ProcessState) {
	t.Helper()
	if st.ExitCode() != 0 {
		t.Fatalf("exit code %d (%s), want 0", st.ExitCode(), st)
	}
	if !strings.Contains(p.logs.String(), `"msg":"Stopped gracefully"`) {
		t.Errorf("no graceful stop logged")
	}
}

func gracefulStop(t *testing.T, bin string) {
	// AckWait 3s: a fetch cut short by SIGTERM leaves its messages
	// delivered but unacknowledged; the restart gets them after AckWait.
	b := newJetStream(t, 3*time.Second)
	db := newDatabase(t)
	db.exec(t, "CREATE SCHEMA app", effectsTable)
	cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
	const total = 30000
	events := plainEvents(total)
	// Far more than the binary settles before SIGTERM, so it lands
	// mid-stream with a batch in flight.
	msgs := make([]outgoing, len(events))
	for i, e := range events {
		msgs[i] = e.outgoing()
	}
	b.publish(t, msgs)
	p := startBinary(t, bin, cfg)
	p.waitStatus(t, "/readyz", http.StatusOK, 30*time.Second)
	if code, _, err := p.get("/healthz"); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz = %d, %v", code, err)
	}
	waitFor(t, 30*time.Second, "some effects", func() error {
		if n := db.queryInt(t, "SELECT count(*) FROM app.effects"); n < 2000 {
			return fmt.Errorf("%d effects", n)
		}
		return nil
	})
	metrics := p.waitStatus(t, "/metrics", http.StatusOK, 5*time.Second)
	for _, name := range []string{`idc_messages_total{sink_kind="postgres"} `, "idc_batch_duration_seconds_bucket", "idc_commit_duration_seconds_count", "go_goroutines", "process_cpu_seconds_total"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	st := p.terminate(t)
	expectCleanExit(t, p, st)

	// What the broker saw acknowledged is exactly what was committed: the
	// transactions in flight at SIGTERM were finished (committed and acked),
	// not abandoned between the two; batches fetched ahead and not started
	// stay unacknowledged. Messages are unique and delivered once each, so
	// acknowledged = delivered - still pending, and nothing beyond the
	// delivered stream sequences was committed.
	info, err := b.info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	acked := int(info.Delivered.Consumer) - info.NumAckPending
	effects := db.queryInt(t, "SELECT count(*) FROM app.effects")
	if effects != acked || acked == 0 || acked >= total {
		t.Fatalf("after SIGTERM: %d effects committed, %d messages acknowledged (of %d): want them equal and mid-stream", effects, acked, total)
	}
	if beyond := db.queryInt(t, "SELECT count(*) FROM app.effects WHERE n >= $1", info.Delivered.Stream); beyond != 0 {
		t.Fatalf("%d effects committed for messages the broker never delivered", beyond)
	}
	t.Logf("SIGTERM after %d of %d messages: committed = acknowledged = %d", effects, total, acked)

	p2 := startBinary(t, bin, cfg)
	waitFor(t, 90*time.Second, "every message applied", func() error {
		if n := db.queryInt(t, "SELECT count(*) FROM app.effects"); n < total {
			return fmt.Errorf("%d of %d effects", n, total)
		}
		return nil
	})
	waitFor(t, 30*time.Second, "every message acknowledged", func() error { return b.drained(context.Background()) })
	expectCleanExit(t, p2, p2.terminate(t))
	checkExactlyOnce(t, db, b, total)
}

func databaseDown(t *testing.T, bin string) {
	b := newJetStream(t, 30*time.Second)
	env := "IDC_INTEGRATION_DOWN_DSN"
	t.Setenv(env, "postgres://postgres@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=2")
	cfg := appendConfig(b.sourceConfig(), env)
	cfg.Delivery.BackoffInitial = config.Duration{Duration: 100 * time.Millisecond}
	p := startBinary(t, bin, cfg)
	p.waitStatus(t, "/healthz", http.StatusOK, 30*time.Second)
	waitFor(t, 30*time.Second, "a logged retry", func() error {
		if !strings.Contains(p.logs.String(), `"msg":"Startup step failed; retrying"`) {
			return fmt.Errorf("no retry logged yet")
		}
		return nil
	})
	for range 5 {
		if code, _, err := p.get("/readyz"); err != nil || code != http.StatusServiceUnavailable {
			t.Fatalf("/readyz with the database down = %d, %v; want 503", code, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if strings.Contains(p.logs.String(), "127.0.0.1:1/nowhere") {
		t.Error("the DSN appears in the logs")
	}
	select {
	case <-p.exited:
		t.Fatalf("exited while the database was down: %s", p.state)
	default:
	}
	expectCleanExit(t, p, p.terminate(t))
}

// failpoint runs the binary armed to SIGKILL itself right after its first
// claim transaction committed and before the broker's ack; the restart
// gets the batch redelivered and must apply none of it twice.
func failpoint(t *testing.T, bin string, db sinkDB) {
	b := newJetStream(t, 2*time.Second)
	db.createEffects(t)
	cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
	db.point(cfg)
	const total = 500
	var msgs []outgoing
	for _, e := range plainEvents(total) {
		msgs = append(msgs, e.outgoing())
	}
	b.publish(t, msgs)

	p := startBinary(t, bin, cfg, "IDC_FAILPOINT=after-commit-before-ack")
	st := p.wait(t, 60*time.Second)
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("exit state %s, want killed by SIGKILL\n%s", st, p.logs.String())
	}
	// Another lane's COMMIT may have been on its way when the process
	// died: count once the database closed every session of it.
	waitFor(t, 20*time.Second, "the killed runtime's database sessions to end", func() error {
		if n := db.runtimeSessions(t); n != 0 {
			return fmt.Errorf("%d sessions left", n)
		}
		return nil
	})
	committed := db.queryInt(t, "SELECT count(*) FROM "+db.table("effects"))
	info, err := b.info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if committed == 0 || info.AckFloor.Stream != 0 {
		t.Fatalf("after the failpoint: %d effects committed, ack floor %d; want a committed batch and nothing acknowledged",
			committed, info.AckFloor.Stream)
	}

	p2 := startBinary(t, bin, cfg)
	waitFor(t, 60*time.Second, "every message acknowledged", func() error { return b.drained(context.Background()) })
	expectCleanExit(t, p2, p2.terminate(t))
	checkExactlyOnce(t, db, b, total)
	t.Logf("%s: killed after committing %d effects; the restart redelivered them and applied none twice", db.dialect(), committed)
	appendVerdict(t, db, "failpoint", 1, 1, total, total).judge(t, db)
}
