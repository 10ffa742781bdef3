package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// The suite's JetStream server: nats-server v2.15.3 (make nats), the
// current release, on the bridge gateway where the host and the pods both
// reach it, with the monitoring endpoint KEDA's nats-jetstream scaler reads.
// Every JetStream step runs against it (the machine's Debian 2.9.10, the
// oldest supported server, stays in the conformance and chaos suites).
const (
	scaleNATSPort    = 4322
	scaleMonitorPort = 8322
)

// startSuiteNATS starts the suite's nats-server, points localcluster's NATS
// URLs at it, and stops it when the suite ends. A server already answering
// there (a suite run before, still up) is used as it is.
func startSuiteNATS(ctx context.Context, t *testing.T) {
	t.Helper()
	url := fmt.Sprintf("nats://%s:%d", localcluster.BridgeIP, scaleNATSPort)
	localcluster.UseNATS(url)
	if nc, err := nats.Connect(url, nats.Timeout(time.Second)); err == nil {
		t.Logf("e2e: nats-server %s already at %s", nc.ConnectedServerVersion(), url)
		nc.Close()
		return
	}
	bin, err := natstest.Binary()
	if err != nil {
		t.Fatalf("the e2e suite runs on the built nats-server (make nats): %v", err)
	}
	dir, err := os.MkdirTemp("", "idc-e2e-nats-")
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "nats-server.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = log.Close() }()
	cmd := exec.Command(bin, "-a", localcluster.BridgeIP, "-p", fmt.Sprint(scaleNATSPort), "-m", fmt.Sprint(scaleMonitorPort),
		"-js", "-sd", filepath.Join(dir, "jetstream"), "-n", "idc-e2e")
	cmd.Stdout, cmd.Stderr = log, log
	// The server dies with the test binary, even when that is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _, _ = cmd.Process.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = os.RemoveAll(dir)
	})
	var version string
	if err := localcluster.Eventually(ctx, 30*time.Second, func() error {
		nc, err := nats.Connect(url, nats.Timeout(time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		version = nc.ConnectedServerVersion()
		return nil
	}); err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "nats-server.log"))
		t.Fatalf("the suite's nats-server on %s did not come up: %v\n%s", url, err, b)
	}
	t.Logf("e2e: nats-server %s at %s (started for this run)", version, url)
}
