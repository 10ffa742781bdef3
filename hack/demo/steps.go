package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

func (d *demo) install(ctx context.Context) error {
	d.stepf("Installing the operator on the real node: kubectl apply --server-side -f %s", d.opts.install)
	c, err := localcluster.Connect(os.Getenv("IDC_DEMO_KUBECONFIG"), d.opts.kubectl)
	if err != nil {
		return err
	}
	d.cluster = c
	d.printf("API server %s   (kubeconfig %s)", c.Config.Host, c.Kubeconfig)
	if err := c.Install(ctx, d.opts.install); err != nil {
		return err
	}
	// How soon a prune run shows in status.lastPrune (a user would patch
	// the manager's args with kustomize the same way).
	patch := fmt.Sprintf(`[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--retention-period=%s"}]`, retentionPeriod)
	if out, err := c.KubectlCmd(ctx, "-n", localcluster.OperatorNamespace, "get", "deployment", localcluster.ManagerDeployment,
		"-o", "jsonpath={.spec.template.spec.containers[0].args}"); err == nil && !strings.Contains(out, "--retention-period") {
		if _, err := c.KubectlCmd(ctx, "-n", localcluster.OperatorNamespace, "patch", "deployment", localcluster.ManagerDeployment, "--type=json", "-p="+patch); err != nil {
			return err
		}
	}
	if err := c.WaitManager(ctx); err != nil {
		return err
	}
	d.printf("manager running as ServiceAccount %s/%s (--retention-period=%s)", localcluster.OperatorNamespace, localcluster.ManagerSA, retentionPeriod)
	out, err := c.KubectlCmd(ctx, "-n", localcluster.OperatorNamespace, "get", "pods", "-o", "wide")
	if err != nil {
		return err
	}
	d.printf("$ kubectl -n %s get pods -o wide\n%s", localcluster.OperatorNamespace, indent(out))
	// A fresh, restricted namespace for the demo.
	_, _ = c.KubectlCmd(ctx, "delete", "namespace", namespace, "--ignore-not-found", "--wait=true", "--timeout=120s")
	if _, err := c.KubectlCmd(ctx, "create", "namespace", namespace); err != nil {
		return err
	}
	if _, err := c.KubectlCmd(ctx, "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"); err != nil {
		return err
	}
	d.printf("namespace %s enforces PodSecurity restricted", namespace)
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
	d.printf("database %s recreated, with table %s.%s (the projection the effect writes)", demoDatabase, idc.Spec.Sink.Schema(), idc.Spec.Sink.Effect.Upsert.Table)
	if d.nc, d.js, err = localcluster.ConnectJetStream(); err != nil {
		return err
	}
	if err := localcluster.RecreateOrdersStream(ctx, d.js, demoStream, demoSubject); err != nil {
		return err
	}
	d.printf("stream %s on %s.> (MaxAge 1h, JetStream's own duplicate window %s)", demoStream, demoSubject, localcluster.StreamDuplicateWindow)
	if err := d.cluster.Client.Create(ctx, localcluster.OrdersSecret(idc, localcluster.PodDSN(d.dsn))); err != nil {
		return fmt.Errorf("creating the Secret: %w", err)
	}
	d.printf("Secret %s/%s holds the DSN as pods reach it (the node forwards PostgreSQL on %s)", namespace, idc.Spec.Sink.ConnectionSecretRef().Name, localcluster.BridgeIP)
	d.printf("sample %s adapted: url %s, stream %s, filterSubject %s, %d replicas",
		localcluster.SamplePath, localcluster.PodNATSURL, demoStream, idc.Spec.Source.NATSJetStream.FilterSubject, d.opts.replicas)
	return nil
}

func (d *demo) apply(ctx context.Context) error {
	d.stepf("Applying IdempotentConsumer %s/%s; the kubelet runs its pods", namespace, d.idc.Name)
	if err := d.cluster.Client.Create(ctx, d.idc.DeepCopy()); err != nil {
		return fmt.Errorf("applying the IdempotentConsumer: %w", err)
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
	return d.printPods(ctx)
}

// printPods shows the consumer pods as kubectl does, with the image digest
// the kubelet runs.
func (d *demo) printPods(ctx context.Context) error {
	out, err := d.cluster.KubectlCmd(ctx, "-n", namespace, "get", "pods", "-o", "wide")
	if err != nil {
		return err
	}
	d.printf("$ kubectl -n %s get pods -o wide\n%s", namespace, indent(out))
	out, err = d.cluster.KubectlCmd(ctx, "-n", namespace, "get", "pods", "-o",
		`custom-columns=POD:.metadata.name,PHASE:.status.phase,NODE:.spec.nodeName,IMAGE:.spec.containers[0].image,DIGEST:.status.containerStatuses[0].imageID`)
	if err != nil {
		return err
	}
	d.printf("$ kubectl -n %s get pods -o custom-columns=...IMAGE,DIGEST\n%s", namespace, indent(out))
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
	job := fmt.Sprintf("%s-prune-demo-%d", d.idc.Name, time.Now().Unix())
	if _, err := d.cluster.KubectlCmd(ctx, "-n", namespace, "create", "job", job, "--from=cronjob/"+d.idc.Name+"-prune"); err != nil {
		return err
	}
	jctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := d.cluster.KubectlCmd(jctx, "-n", namespace, "wait", "--for=condition=Complete", "job/"+job, "--timeout=120s"); err != nil {
		return err
	}
	var j batchv1.Job
	if err := d.cluster.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: job}, &j); err != nil {
		return err
	}
	d.printf("Job %s completed in a kubelet-run pod (idc-runtime prune); waiting for status.lastPrune", job)
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
	if d.nc != nil {
		d.nc.Close()
	}
	if d.cluster != nil {
		fmt.Fprintf(os.Stderr, "the node stays up (make node-down stops it); database %s is kept for inspection: psql %s\n", demoDatabase, d.dsn)
	}
}
