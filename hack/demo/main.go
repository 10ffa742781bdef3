// Command demo runs idc-operator end to end on the real single-node cluster
// that `make node-up` starts (hack/node.sh): it installs the operator from
// dist/install.yaml (the image `make image` built, imported into the node),
// applies the JetStream -> PostgreSQL upsert sample adapted to the local
// services, lets the kubelet run the consumer's pods, publishes order events
// with duplicates and out-of-order versions, runs the prune CronJob once, and
// prints what happened, with `kubectl get pods` and the image digest.
//
// Usage (make demo starts the node and runs it):
//
//	idc-demo -install dist/install.yaml -kubectl bin/k8s/.../kubectl -image idc-operator:0.2.0 \
//	  [--once] [--orders N] [--versions N] [--replicas N]     (kubeconfig: $IDC_DEMO_KUBECONFIG)
//
// It stays up until Ctrl-C; with --once it exits after the summary: 0 when
// every unique id took effect exactly once and the resource is Ready, 1
// otherwise, 2 when a local service is missing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// Names of what the demo creates; the database is recreated on every run.
const (
	demoDatabase = "idc_demo"
	demoStream   = "IDC_DEMO_ORDERS"
	demoSubject  = "idc-demo.orders"
	// namespace enforces PodSecurity `restricted`.
	namespace = "idc-demo"
	// retentionPeriod is the manager's --retention-period: how soon a prune
	// run shows in status.lastPrune.
	retentionPeriod = 10 * time.Second
)

type options struct {
	install, kubectl, image string
	once                    bool
	orders                  int
	versions                int
	replicas                int
}

// errNotExactlyOnce is the --once failure.
var errNotExactlyOnce = errors.New("the demo did not end with exactly one effect per unique id and Ready=True")

// errServices is a missing local service.
var errServices = errors.New("a local service is missing")

func main() {
	var o options
	flag.StringVar(&o.install, "install", "dist/install.yaml", "the install manifest (make build-installer)")
	flag.StringVar(&o.kubectl, "kubectl", "kubectl", "kubectl at the node's version")
	flag.StringVar(&o.image, "image", "idc-operator:dev", "the operator image imported into the node")
	flag.BoolVar(&o.once, "once", false, "exit after the summary (0 when effects = unique ids and Ready, else 1)")
	flag.IntVar(&o.orders, "orders", 50, "orders in the demo stream")
	flag.IntVar(&o.versions, "versions", 4, "versions (status changes) per order")
	flag.IntVar(&o.replicas, "replicas", 2, "consumer replicas")
	flag.Parse()
	if o.orders < 1 || o.versions < 1 || o.replicas < 1 {
		fmt.Fprintln(os.Stderr, "demo: --orders, --versions and --replicas must be at least 1")
		os.Exit(2)
	}
	// The demo's own Kubernetes client logs nothing: its output is the story.
	ctrllog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A closed stdout (| head, a pager quit early) must not kill the demo
	// before it has stopped what it started.
	signal.Ignore(syscall.SIGPIPE)
	d := &demo{opts: o, out: os.Stdout}
	err := d.run(ctx)
	d.shutdown()
	switch {
	case errors.Is(err, errServices):
		os.Exit(2)
	case err != nil && ctx.Err() == nil:
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// demo holds what it started, for the shutdown.
type demo struct {
	opts options
	out  io.Writer
	step int

	cluster   *localcluster.Cluster
	nc        *nats.Conn
	js        jetstream.JetStream
	dsn       string
	idc       *messagingv1alpha1.IdempotentConsumer
	workload  *localcluster.Workload
	published localcluster.PublishStats
}

const totalSteps = 7

func (d *demo) stepf(format string, args ...any) {
	d.step++
	_, _ = fmt.Fprintf(d.out, "\n==> [%d/%d] %s\n", d.step, totalSteps, fmt.Sprintf(format, args...))
}

func (d *demo) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(d.out, "    "+format+"\n", args...)
}

func (d *demo) run(ctx context.Context) error {
	_, _ = fmt.Fprintln(d.out, "idc-operator demo: NATS JetStream -> PostgreSQL upsert, exactly one effect per message id")
	if err := d.checkServices(ctx); err != nil {
		return err
	}
	for _, phase := range []func(context.Context) error{d.install, d.prepare, d.apply, d.publishAndConsume, d.prune} {
		if err := phase(ctx); err != nil {
			return err
		}
	}
	ok, err := d.summary(ctx)
	if err != nil {
		return err
	}
	if d.opts.once {
		if !ok {
			return errNotExactlyOnce
		}
		return nil
	}
	_, _ = fmt.Fprintf(d.out, "\nThe demo keeps running: the node, the operator and the consumer stay up.\n"+
		"  %s --kubeconfig %s -n %s get idc,pods -o wide\n  publish more to subject %s.events on stream %s\n"+
		"Press Ctrl-C to stop the demo; `make node-down` stops the node.\n",
		d.opts.kubectl, d.cluster.Kubeconfig, namespace, demoSubject, demoStream)
	<-ctx.Done()
	_, _ = fmt.Fprintln(d.out, "\nstopping...")
	return nil
}

func (d *demo) checkServices(ctx context.Context) error {
	d.stepf("Checking the local services (PostgreSQL 127.0.0.1:5432, NATS JetStream 127.0.0.1:4222)")
	if err := localcluster.CheckServices(ctx); err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "\n%v\n\nStart the local services with:  make services\n", err)
		return errServices
	}
	d.printf("both up")
	return nil
}
