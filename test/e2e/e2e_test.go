// Package e2e runs the operator end to end on this machine: envtest's
// kube-apiserver and etcd, the real manager binary, the local pod runner
// executing the real idc-runtime binary exactly as the Deployment and Jobs
// declare it, and the real PostgreSQL and NATS JetStream on loopback. A
// service that is down fails the suite; it never skips.
package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
	"github.com/idempotency-dev/idc-operator/test/podrunner"
)

func TestJetStreamUpsertEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	h := newHarness(ctx, t)

	if err := h.cluster.Client.Create(ctx, h.idc); err != nil {
		t.Fatalf("applying the adapted sample: %v", err)
	}
	idc := h.waitFor(ctx, t, 3*time.Minute, "Ready=True from the real runtime processes", localcluster.IsReady)
	h.checkRuntimeReady(ctx, t, idc)

	w := localcluster.NewWorkload(60, 4, 0.4, 42)
	h.publishAndVerify(ctx, t, w)
	h.pruneThroughCronJob(ctx, t)
	h.rollOnTemplateChange(ctx, t)
	h.suspendScalesToZero(ctx, t)
}

// checkRuntimeReady: RuntimeReady comes from the Deployment status the
// runner wrote from the processes' /readyz.
func (h *harness) checkRuntimeReady(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer) {
	if got := localcluster.Condition(idc, messagingv1alpha1.ConditionRuntimeReady); got != "True/Ready" {
		t.Fatalf("RuntimeReady = %s", got)
	}
	var d appsv1.Deployment
	if err := h.cluster.Client.Get(ctx, h.key(), &d); err != nil {
		t.Fatal(err)
	}
	if d.Status.ReadyReplicas != 2 || d.Status.ObservedGeneration != d.Generation {
		t.Fatalf("Deployment status = %+v, want 2 ready replicas for generation %d", d.Status, d.Generation)
	}
	pods := h.runner.PodsOf("Deployment/" + h.setup.Name)
	if len(pods) != 2 {
		t.Fatalf("runner pods = %s, want 2", describePods(pods))
	}
	if pods[0].Addr("metrics") == pods[1].Addr("metrics") {
		t.Fatalf("both replicas serve on %s", pods[0].Addr("metrics"))
	}
	for _, p := range pods {
		if !p.Ready || p.Phase != podrunner.PhaseRunning {
			t.Fatalf("pod %s is not running and ready: %s", p.Name, describePods(pods))
		}
	}
	t.Logf("Ready: %s; pods %s", localcluster.Condition(idc, messagingv1alpha1.ConditionReady), describePods(pods))
}

// publishAndVerify: duplicates (producer retries, later re-sends) and
// versions out of order give exactly one effect per id and the latest
// state per order.
func (h *harness) publishAndVerify(ctx context.Context, t *testing.T, w *localcluster.Workload) {
	stats, err := w.Publish(ctx, h.js, h.setup.Subject, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("published %+v (%d unique ids, %d orders with swapped versions)", stats, len(w.UniqueIDs), w.Swapped)
	if stats.Stored != len(w.UniqueIDs)+len(w.Resends)+len(w.Poison) {
		t.Fatalf("JetStream stored %d messages, want %d originals + %d re-sends + %d poison", stats.Stored, len(w.UniqueIDs), len(w.Resends), len(w.Poison))
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := localcluster.WaitDrained(dctx, h.js, h.setup.Stream, h.setup.Name, nil); err != nil {
		t.Fatalf("%v; pods: %s", err, describePods(h.runner.Pods()))
	}
	out, err := w.Verify(ctx, h.dsn, h.idc)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("outcome %+v", out)
	if !out.OK() {
		t.Fatalf("not exactly one effect per id: %+v", out)
	}
	if out.DeadLetterRows != len(w.Poison) {
		t.Fatalf("dead letters = %d, want %d (the poison messages)", out.DeadLetterRows, len(w.Poison))
	}
	h.checkMetrics(ctx, t, w, stats)
}

func (h *harness) checkMetrics(ctx context.Context, t *testing.T, w *localcluster.Workload, stats localcluster.PublishStats) {
	pods := h.runner.PodsOf("Deployment/" + h.setup.Name)
	m, err := localcluster.Metrics(ctx, pods)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("metrics over %d replicas: %v", len(pods), m)
	restarts := 0
	for _, p := range pods {
		restarts += p.Restarts
	}
	if restarts > 0 {
		t.Fatalf("replicas restarted %d times during the run: %s", restarts, describePods(pods))
	}
	delivered, dups := m["idc_messages_total"], m["idc_duplicates_skipped_total"]
	if int(delivered) < stats.Stored {
		t.Fatalf("idc_messages_total = %v, want at least the %d stored messages", delivered, stats.Stored)
	}
	if int(dups) < len(w.Resends) {
		t.Fatalf("idc_duplicates_skipped_total = %v, want at least the %d re-sends", dups, len(w.Resends))
	}
	if got := int(m["idc_dead_letters_total"]); got != len(w.Poison) {
		t.Fatalf("idc_dead_letters_total = %d, want %d", got, len(w.Poison))
	}
	if applied := int(delivered - dups - m["idc_dead_letters_total"]); applied != len(w.UniqueIDs) {
		t.Fatalf("delivered - duplicates - dead letters = %d, want the %d unique ids", applied, len(w.UniqueIDs))
	}
}

// pruneThroughCronJob: a Job from the prune CronJob runs `idc-runtime
// prune` through the runner and succeeds; the controller then reads the run
// into status.lastPrune.
func (h *harness) pruneThroughCronJob(ctx context.Context, t *testing.T) {
	job, err := h.runner.TriggerCronJob(ctx, h.setup.Name+"-prune")
	if err != nil {
		t.Fatal(err)
	}
	jctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	j, err := h.runner.WaitForJob(jctx, job)
	if err != nil {
		t.Fatalf("%v; pods: %s", err, describePods(h.runner.Pods()))
	}
	if j.Status.Succeeded != 1 || j.Status.CompletionTime == nil {
		t.Fatalf("job status = %+v", j.Status)
	}
	idc := h.waitFor(ctx, t, time.Minute, "status.lastPrune after the prune Job", func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		return idc.Status.LastPrune != nil && idc.Status.LastPrune.Time != nil && !idc.Status.LastPrune.Time.Before(j.Status.StartTime)
	})
	lp := idc.Status.LastPrune
	// Every id is younger than the window (hours): nothing may go.
	if lp.RowsDeleted != 0 {
		t.Fatalf("the prune deleted %d rows inside the window", lp.RowsDeleted)
	}
	t.Logf("lastPrune: time=%s cutoff=%s rowsDeleted=%d", lp.Time, lp.Cutoff, lp.RowsDeleted)
}

// rollOnTemplateChange: a spec change that changes the runtime config
// (config-hash annotation) replaces the processes, and Ready comes back.
func (h *harness) rollOnTemplateChange(ctx context.Context, t *testing.T) {
	old := map[string]bool{}
	for _, p := range h.runner.PodsOf("Deployment/" + h.setup.Name) {
		old[p.Name] = true
	}
	h.update(ctx, t, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Delivery.BatchSize = 250 })
	eventually(ctx, t, 2*time.Minute, "new ready pods after the config change", func() error {
		pods := h.runner.PodsOf("Deployment/" + h.setup.Name)
		for _, p := range pods {
			if old[p.Name] || !p.Ready {
				return fmt.Errorf("pods: %s", describePods(pods))
			}
		}
		if len(pods) != 2 {
			return fmt.Errorf("pods: %s", describePods(pods))
		}
		return nil
	})
	h.waitFor(ctx, t, 2*time.Minute, "Ready=True after the rollout", localcluster.IsReady)
	t.Logf("config change rolled the pods: %s", describePods(h.runner.PodsOf("Deployment/"+h.setup.Name)))
}

// suspendScalesToZero: spec.suspend scales the Deployment to 0 and the
// runner stops the processes.
func (h *harness) suspendScalesToZero(ctx context.Context, t *testing.T) {
	h.update(ctx, t, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Suspend = true })
	eventually(ctx, t, time.Minute, "no consumer pods while suspended", func() error {
		if pods := h.runner.PodsOf("Deployment/" + h.setup.Name); len(pods) != 0 {
			return fmt.Errorf("pods: %s", describePods(pods))
		}
		var d appsv1.Deployment
		if err := h.cluster.Client.Get(ctx, h.key(), &d); err != nil {
			return err
		}
		if ptr.Deref(d.Spec.Replicas, 1) != 0 || d.Status.Replicas != 0 {
			return fmt.Errorf("deployment replicas spec=%d status=%d", ptr.Deref(d.Spec.Replicas, 1), d.Status.Replicas)
		}
		return nil
	})
	h.waitFor(ctx, t, time.Minute, "RuntimeReady=True/Suspended", func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		return localcluster.Condition(idc, messagingv1alpha1.ConditionRuntimeReady) == "True/"+messagingv1alpha1.ReasonSuspended
	})
	t.Log("suspended: the Deployment is at 0 replicas and no process runs")
}

func (h *harness) update(ctx context.Context, t *testing.T, mutate func(*messagingv1alpha1.IdempotentConsumer)) {
	t.Helper()
	eventually(ctx, t, 30*time.Second, "updating the resource", func() error {
		idc := h.get(ctx, t)
		mutate(idc)
		return h.cluster.Client.Update(ctx, idc, &client.UpdateOptions{})
	})
}
