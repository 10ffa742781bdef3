package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
	"github.com/idempotency-dev/idc-operator/test/podrunner"
)

func (d *demo) startControlPlane(ctx context.Context) error {
	d.stepf("Starting the local control plane (kube-apiserver + etcd) and the manager")
	if !localcluster.EnvtestBinariesBuilt() {
		d.printf("first run: building kube-apiserver and etcd from source with hack/build-envtest.sh;")
		d.printf("this takes ~10+ minutes on 2 cores (seconds on later runs)...")
	}
	d.workDir = filepath.Join(os.TempDir(), "idc-demo")
	if err := os.RemoveAll(d.workDir); err != nil {
		return err
	}
	if err := os.MkdirAll(d.workDir, 0o755); err != nil {
		return err
	}
	c, err := localcluster.Start(d.workDir)
	if err != nil {
		return err
	}
	d.cluster = c
	d.printf("API server %s", c.Config.Host)
	d.printf("kubeconfig %s   (kubectl --kubeconfig %s get idc -o wide)", c.Kubeconfig, c.Kubeconfig)
	managerLog := filepath.Join(d.workDir, "manager.log")
	m, err := localcluster.StartManager(ctx, localcluster.ManagerOptions{
		Binary: d.bins.Manager, Kubeconfig: c.Kubeconfig, RetentionPeriod: retentionPeriod, LogPath: managerLog,
	})
	if err != nil {
		return err
	}
	d.manager = m
	d.printf("manager running (--retention-period=%s), log %s", retentionPeriod, managerLog)
	return nil
}

func (d *demo) prepare(ctx context.Context) error {
	d.stepf("Preparing PostgreSQL database %s, NATS stream %s and the sample", demoDatabase, demoStream)
	idc, err := localcluster.LoadOrdersSample(localcluster.OrdersSetup{
		Namespace: namespace, Name: "orders-projector", Stream: demoStream, Subject: demoSubject,
		Secret: "orders-db", Replicas: int32(d.opts.replicas),
	})
	if err != nil {
		return err
	}
	d.idc = idc
	if d.dsn, err = localcluster.PrepareOrdersDatabase(ctx, demoDatabase, idc); err != nil {
		return err
	}
	d.printf("database %s recreated, with table %s.%s (the projection the effect writes)", demoDatabase, idc.Spec.Sink.Postgres.Schema, idc.Spec.Sink.Effect.Upsert.Table)
	if d.nc, d.js, err = localcluster.ConnectJetStream(); err != nil {
		return err
	}
	if err := localcluster.RecreateOrdersStream(ctx, d.js, demoStream, demoSubject); err != nil {
		return err
	}
	d.printf("stream %s on %s.> (MaxAge 1h, JetStream's own duplicate window %s)", demoStream, demoSubject, localcluster.StreamDuplicateWindow)
	if err := d.cluster.Client.Create(ctx, localcluster.OrdersSecret(idc, d.dsn)); err != nil {
		return fmt.Errorf("creating the Secret: %w", err)
	}
	d.printf("Secret %s/%s holds the DSN (%s)", namespace, idc.Spec.Sink.Postgres.ConnectionSecretRef.Name, d.dsn)
	d.printf("sample %s adapted: url %s, stream %s, filterSubject %s, %d replicas",
		localcluster.SamplePath, localcluster.NATSURL, demoStream, idc.Spec.Source.NATSJetStream.FilterSubject, d.opts.replicas)
	return nil
}

func (d *demo) apply(ctx context.Context) error {
	d.stepf("Applying IdempotentConsumer %s/%s and running its pods as local processes", namespace, d.idc.Name)
	if err := d.cluster.Client.Create(ctx, d.idc.DeepCopy()); err != nil {
		return fmt.Errorf("applying the IdempotentConsumer: %w", err)
	}
	if err := d.startRunner(); err != nil {
		return err
	}
	last := ""
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	idc, err := localcluster.WaitFor(wctx, d.cluster.Client, d.key(), localcluster.IsReady, func(idc *messagingv1alpha1.IdempotentConsumer) {
		if line := conditionLine(idc); line != last && line != "" {
			d.printf("%s", line)
			last = line
		}
	})
	if err != nil {
		return err
	}
	d.printf("Ready: %s", localcluster.Condition(idc, messagingv1alpha1.ConditionReady))
	for _, p := range d.runner.PodsOf("Deployment/" + d.idc.Name) {
		d.printf("pod %s  pid %d  ready=%t  metrics http://%s/metrics  log %s", p.Name, p.PID, p.Ready, p.Addr("metrics"), p.LogPath)
	}
	return nil
}

func (d *demo) startRunner() error {
	runnerLog, err := os.Create(filepath.Join(d.workDir, "podrunner.log"))
	if err != nil {
		return err
	}
	log := fileLogger(runnerLog)
	opts := localcluster.RunnerOptions(namespace, d.bins.Runtime, filepath.Join(d.workDir, "pods"), log)
	opts.RunSchedules = true
	r, err := podrunner.New(d.cluster.Config, opts)
	if err != nil {
		return err
	}
	d.runner = r
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	d.runnerEnd = func() {
		cancel()
		<-done
		_ = runnerLog.Close()
	}
	d.printf("pod runner: /idc-runtime -> %s, logs in %s", d.bins.Runtime, filepath.Join(d.workDir, "pods", "logs"))
	return nil
}

func conditionLine(idc *messagingv1alpha1.IdempotentConsumer) string {
	parts := make([]string, 0, len(idc.Status.Conditions))
	for _, c := range idc.Status.Conditions {
		if c.Type == messagingv1alpha1.ConditionReconciling || c.Type == messagingv1alpha1.ConditionStalled {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s=%s", c.Type, c.Status))
	}
	return strings.Join(parts, " ")
}

func (d *demo) key() client.ObjectKey {
	return client.ObjectKey{Namespace: namespace, Name: d.idc.Name}
}

func (d *demo) publishAndConsume(ctx context.Context) error {
	o := d.opts
	d.stepf("Publishing %d orders x %d versions, with duplicates and out-of-order versions", o.orders, o.versions)
	d.workload = localcluster.NewWorkload(o.orders, o.versions, 0.4, uint64(time.Now().UnixNano()))
	w := d.workload
	d.printf("%d unique ids; %d orders have two versions swapped; %d producer retries; %d re-sent later; %d poison",
		len(w.UniqueIDs), w.Swapped, len(w.RetryAfter), len(w.Resends), len(w.Poison))
	stats, err := w.Publish(ctx, d.js, demoSubject, func(phase string, s localcluster.PublishStats) {
		d.printf("%-9s published %4d  stored %4d  dropped by the broker's window %d", phase, s.Published, s.Stored, s.DroppedByBroker)
	})
	if err != nil {
		return err
	}
	d.published = stats
	d.stepf("Consuming: waiting until every stored message is acknowledged")
	last := uint64(1<<63 - 1)
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	info, err := localcluster.WaitDrained(wctx, d.js, demoStream, d.idc.Name, func(i *jetstream.ConsumerInfo) {
		if left := i.NumPending + uint64(i.NumAckPending); left != last {
			last = left
			d.printf("delivered %4d/%d   awaiting delivery %d   awaiting ack %d", i.Delivered.Stream, stats.Stored, i.NumPending, i.NumAckPending)
		}
	})
	if err != nil {
		return err
	}
	d.printf("drained: %d messages delivered by JetStream, all acknowledged", info.Delivered.Stream)
	return nil
}

func (d *demo) prune(ctx context.Context) error {
	d.stepf("Running the prune CronJob once (kubectl create job --from=cronjob/%s-prune)", d.idc.Name)
	job, err := d.runner.TriggerCronJob(ctx, d.idc.Name+"-prune")
	if err != nil {
		return err
	}
	jctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	j, err := d.runner.WaitForJob(jctx, job)
	if err != nil {
		return err
	}
	d.printf("Job %s succeeded (idc-runtime prune); waiting for status.lastPrune", job)
	idc, err := localcluster.WaitFor(jctx, d.cluster.Client, d.key(), func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		lp := idc.Status.LastPrune
		return lp != nil && lp.Time != nil && !lp.Time.Before(j.Status.StartTime)
	}, nil)
	if err != nil {
		return err
	}
	lp := idc.Status.LastPrune
	d.printf("lastPrune: cutoff %s, %d rows deleted (every id is younger than the %s window)",
		lp.Cutoff.UTC().Format(time.RFC3339), lp.RowsDeleted, windowOf(idc))
	return nil
}

func windowOf(idc *messagingv1alpha1.IdempotentConsumer) string {
	if idc.Status.Retention == nil {
		return "unresolved"
	}
	return idc.Status.Retention.Window
}

func (d *demo) shutdown() {
	if d.runnerEnd != nil {
		d.runnerEnd()
	}
	if d.manager != nil {
		_ = d.manager.Stop(20 * time.Second)
	}
	if d.cluster != nil {
		if err := d.cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
		}
	}
	if d.nc != nil {
		d.nc.Close()
	}
	if d.workDir != "" {
		fmt.Fprintf(os.Stderr, "logs: %s (database %s is kept for inspection: psql %s)\n", d.workDir, demoDatabase, d.dsn)
	}
}
