package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/nats-io/nats.go/jetstream"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
	"github.com/idempotency-dev/idc-operator/test/podrunner"
)

// harness is one e2e environment: control plane, real manager, local pod
// runner, a fresh database and stream.
type harness struct {
	dir     string
	cluster *localcluster.Cluster
	manager *localcluster.Process
	runner  *podrunner.Runner
	js      jetstream.JetStream
	dsn     string
	setup   localcluster.OrdersSetup
	idc     *messagingv1alpha1.IdempotentConsumer
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newHarness starts everything; services that are down fail the test.
func newHarness(ctx context.Context, t *testing.T) *harness {
	t.Helper()
	if err := localcluster.CheckServices(ctx); err != nil {
		t.Fatalf("the e2e suite needs the local services: %v", err)
	}
	h := &harness{dir: workDir(t)}
	start := time.Now()
	bins, err := localcluster.Build(ctx, filepath.Join(h.dir, "bin"), os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built the manager and idc-runtime in %s", time.Since(start).Round(time.Second))
	h.startCluster(ctx, t, bins)
	h.startRunner(ctx, t, bins)
	h.prepare(ctx, t)
	return h
}

// workDir is kept when the test fails, for its logs.
func workDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "idc-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

func (h *harness) startCluster(ctx context.Context, t *testing.T, bins localcluster.Binaries) {
	t.Helper()
	c, err := localcluster.Start(h.dir)
	if err != nil {
		t.Fatal(err)
	}
	h.cluster = c
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	managerLog := filepath.Join(h.dir, "manager.log")
	m, err := localcluster.StartManager(ctx, localcluster.ManagerOptions{
		Binary: bins.Manager, Kubeconfig: c.Kubeconfig, RetentionPeriod: 5 * time.Second, LogPath: managerLog,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.manager = m
	t.Cleanup(func() {
		if err := m.Stop(20 * time.Second); err != nil {
			t.Error("stopping the manager:", err)
		}
		if t.Failed() {
			dumpTail(t, managerLog, 60)
		}
	})
}

func (h *harness) startRunner(ctx context.Context, t *testing.T, bins localcluster.Binaries) {
	t.Helper()
	opts := localcluster.RunnerOptions("default", bins.Runtime, filepath.Join(h.dir, "pods"), testLogger(t))
	r, err := podrunner.New(h.cluster.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	h.runner = r
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(rctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(h.dir, "pods", "logs", "*.log"))
			for _, l := range logs {
				dumpTail(t, l, 30)
			}
		}
	})
}

// prepare creates the database, the stream and the Secret, and adapts the
// sample; the resource itself is applied by the test.
func (h *harness) prepare(ctx context.Context, t *testing.T) {
	t.Helper()
	suffix := randomSuffix()
	h.setup = localcluster.OrdersSetup{
		Namespace: "default", Name: "orders-projector", Stream: "IDC_E2E_" + strings.ToUpper(suffix),
		Subject: "idc-e2e-" + suffix + ".orders", Secret: "orders-db", Replicas: 2,
	}
	idc, err := localcluster.LoadOrdersSample(h.setup)
	if err != nil {
		t.Fatal(err)
	}
	h.idc = idc
	db := "idc_e2e_" + suffix
	if h.dsn, err = localcluster.PrepareOrdersDatabase(ctx, db, idc); err != nil {
		t.Fatal(err)
	}
	nc, js, err := localcluster.ConnectJetStream()
	if err != nil {
		t.Fatal(err)
	}
	h.js = js
	if err := localcluster.RecreateOrdersStream(ctx, js, h.setup.Stream, h.setup.Subject); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The runner and manager are stopped by then (cleanups run last
		// registered first), so nothing holds the database.
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = js.DeleteStream(cctx, h.setup.Stream)
		nc.Close()
		if err := localcluster.DropDatabase(cctx, db); err != nil {
			t.Error(err)
		}
	})
	if err := h.cluster.Client.Create(ctx, localcluster.OrdersSecret(idc, h.dsn)); err != nil {
		t.Fatal(err)
	}
}

func (h *harness) key() client.ObjectKey {
	return client.ObjectKey{Namespace: h.setup.Namespace, Name: h.setup.Name}
}

func (h *harness) get(ctx context.Context, t *testing.T) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	idc := &messagingv1alpha1.IdempotentConsumer{}
	if err := h.cluster.Client.Get(ctx, h.key(), idc); err != nil {
		t.Fatal(err)
	}
	return idc
}

// waitFor waits for a state of the resource, failing the test with the
// conditions it had.
func (h *harness) waitFor(ctx context.Context, t *testing.T, timeout time.Duration, what string, done func(*messagingv1alpha1.IdempotentConsumer) bool) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	idc, err := localcluster.WaitFor(ctx, h.cluster.Client, h.key(), done, nil)
	if err != nil {
		t.Fatalf("%s: %v\npods: %s", what, err, describePods(h.runner.Pods()))
	}
	return idc
}

// eventually polls cond until it returns nil.
func eventually(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func describePods(pods []podrunner.PodInfo) string {
	parts := make([]string, 0, len(pods))
	for _, p := range pods {
		parts = append(parts, fmt.Sprintf("%s(%s ready=%t restarts=%d %s %s)", p.Name, p.Phase, p.Ready, p.Restarts, p.LastExit, p.LastError))
	}
	return strings.Join(parts, ", ")
}

func dumpTail(t *testing.T, path string, n int) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	t.Logf("--- last %d lines of %s ---\n%s", len(lines), path, strings.Join(lines, "\n"))
}

// testLogger logs through t until the test ends.
func testLogger(t *testing.T) logr.Logger {
	var done atomic.Bool
	t.Cleanup(func() { done.Store(true) }) // registered first, so it runs last
	return funcr.New(func(prefix, args string) {
		if !done.Load() {
			t.Log("podrunner:", prefix, args)
		}
	}, funcr.Options{})
}
