package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// The outage step's resource: its own stream, durable consumer, inbox and
// effect table, so that the other steps' resources are not disturbed.
const (
	outageName       = "outage-ledger"
	outageTable      = "events_outage"
	outageInbox      = "inbox_outage_ledger"
	outageAckWait    = 5 * time.Second
	outageMaxDeliver = 5
	outageMaxOutage  = 10 * time.Second
	failpointEnvVar  = "IDC_FAILPOINT"
	failpointValue   = "after-commit-before-ack"
)

// suspendAfterCrash: a runtime SIGKILLs itself between COMMIT and ack (the
// runtime's failpoint), and the resource is suspended right after, for
// longer than its maxConsumerOutage, its derived window and the 30 s after
// which a silent replica counts as gone. A prune Job made from the CronJob
// runs during the suspension: it deletes nothing the broker can still hand
// back, and the hold shows in its output, in status.lastPrune, in the
// Ready and PruneScheduled conditions and in `kubectl get idc -o wide`. On
// resume the broker redelivers and every id has exactly one effect; a
// second prune run, once the broker shows everything settled, is not held
// back any more.
//
// Every event is published after the crashing replica started: rows a
// replica claimed and acknowledged before it are outside any hold and the
// window alone may delete them, so "no row deleted" is asserted over claims
// of the crashing replica only.
func (s *suite) suspendAfterCrash(ctx context.Context, t *testing.T) {
	stepStart := time.Now()
	nc, js, err := localcluster.ConnectJetStream()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	stream, subject := "IDC_E2E_OUTAGE_"+strings.ToUpper(s.suffix), "idc-e2e-"+s.suffix+".outage"
	// WorkQueue retention: nothing is replayed beyond redelivery, so the
	// window is the redelivery horizon, min(MaxAge, A + O) + margin.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{subject}, Retention: jetstream.WorkQueuePolicy, MaxAge: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	// A consumer the test makes: the runtime uses an existing one as it is.
	if _, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: outageName, AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait: outageAckWait, MaxDeliver: outageMaxDeliver,
	}); err != nil {
		t.Fatal(err)
	}
	s.exec(ctx, t, fmt.Sprintf("CREATE TABLE e2e.%s (event_id text NOT NULL, num int NOT NULL)", outageTable))

	idc := s.apply(ctx, t, fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: %s}
spec:
  source:
    natsJetStream: {url: %q, stream: %s, consumer: %s}
  message:
    id: {jsonPath: $.eventId}
  sink:
    postgres: {connectionSecretRef: {name: e2e-db, key: dsn}, schema: e2e}
    inbox: {table: %s, deletionPolicy: Delete}
    effect:
      append: {table: %s, columns: {event_id: "@messageId", num: $.n}}
  delivery: {batchSize: 100, maxWait: 100ms}
  retention:
    maxConsumerOutage: %s
    safetyMargin: 5s
    maxReplayAge: 20s
    # Only the Jobs the test makes run during the step.
    prune: {schedule: "0 0 1 1 *"}
  runtime: {replicas: 1}
`, outageName, localcluster.PodNATSURL, stream, outageName, outageInbox, outageTable, outageMaxOutage))
	t.Cleanup(func() { s.cleanupOutage(t, idc, js, stream) })

	got := s.waitReady(ctx, t, idc, 1)
	window, err := time.ParseDuration(got.Status.Retention.Window)
	if err != nil || window <= 0 || window >= time.Minute {
		t.Fatalf("status.retention.window %q (%v): want a window under a minute", got.Status.Retention.Window, err)
	}
	t.Logf("OUTAGE window=%s (redelivery %s, replay %s) derivedFrom: %s", window,
		got.Status.Retention.RedeliveryHorizon, got.Status.Retention.ReplayHorizon, got.Status.Retention.DerivedFrom)

	// 2. Arm the failpoint with a foreign env entry; the rollout replaces
	// the pod (the old one stops gracefully, having nothing unacknowledged).
	// The runtime is PID 1 of its container, and the kernel drops every
	// signal PID 1 sends itself without a handler, SIGKILL included
	// (pid_namespaces(7)): the failpoint would hang after the COMMIT instead
	// of dying. Sharing the pod's process namespace makes the pause
	// container PID 1, so the runtime's SIGKILL kills it; the controller
	// does not set that field either.
	if _, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "patch", "deployment", outageName, "--type=strategic",
		`-p={"spec":{"template":{"spec":{"shareProcessNamespace":true}}}}`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "set", "env", "deployment/"+outageName, failpointEnvVar+"="+failpointValue); err != nil {
		t.Fatal(err)
	}
	armedAt := time.Now()
	if err := localcluster.Eventually(ctx, 3*time.Minute, func() error {
		pods, err := s.c.Pods(ctx, testNamespace, s.deployment(ctx, t, idc).Spec.Selector.MatchLabels)
		if err != nil {
			return err
		}
		if len(pods) != 1 || !hasFailpoint(&pods[0]) || !localcluster.PodReady(&pods[0]) {
			return fmt.Errorf("want only the armed pod, ready:%s", localcluster.DescribePods(pods))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !hasFailpoint(deploymentTemplate(s.deployment(ctx, t, idc))) {
		t.Fatal("the controller removed the IDC_FAILPOINT env entry during the rollout")
	}

	// 1. The workload, after the armed replica started (see above).
	e := newEvents("out", 2000, 0.2, 5)
	for i, b := range e.sends {
		if _, err := js.PublishAsync(subject, b); err != nil {
			t.Fatal(err)
		}
		if i%500 == 499 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
	publishedAt := time.Now()

	// Wait for the SIGKILL between COMMIT and ack.
	var killed corev1.Pod
	var killInfo string
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		pods, err := s.c.Pods(ctx, testNamespace, s.deployment(ctx, t, idc).Spec.Selector.MatchLabels)
		if err != nil {
			return err
		}
		for i := range pods {
			if !hasFailpoint(&pods[i]) {
				continue
			}
			if info, ok := killedBySIGKILL(&pods[i]); ok {
				killed, killInfo = pods[i], info
				return nil
			}
		}
		return fmt.Errorf("no armed pod restarted or was SIGKILLed yet:%s", localcluster.DescribePods(pods))
	}); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()

	// 3. Suspend at once.
	s.update(ctx, t, idc, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Suspend = true })
	s.waitNoPods(ctx, t, idc)
	suspendedAt := time.Now()
	// The controller applied replicas 0 (server-side) and left the env
	// entry it does not own alone.
	if d := s.deployment(ctx, t, idc); ptr.Deref(d.Spec.Replicas, 1) != 0 || !hasFailpoint(deploymentTemplate(d)) {
		t.Fatalf("after the suspension: replicas %d, failpoint env kept %t", ptr.Deref(d.Spec.Replicas, 1), hasFailpoint(deploymentTemplate(d)))
	}
	if d := s.deployment(ctx, t, idc); !ptr.Deref(d.Spec.Template.Spec.ShareProcessNamespace, false) {
		t.Fatal("the controller's apply removed shareProcessNamespace")
	}
	if _, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "set", "env", "deployment/"+outageName, failpointEnvVar+"-"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "patch", "deployment", outageName, "--type=strategic",
		`-p={"spec":{"template":{"spec":{"shareProcessNamespace":null}}}}`); err != nil {
		t.Fatal(err)
	}
	if d := s.deployment(ctx, t, idc); hasFailpoint(deploymentTemplate(d)) || d.Spec.Template.Spec.ShareProcessNamespace != nil || ptr.Deref(d.Spec.Replicas, 1) != 0 {
		t.Fatalf("removing the failpoint: env still there %t, shareProcessNamespace %v, replicas %d",
			hasFailpoint(deploymentTemplate(d)), d.Spec.Template.Spec.ShareProcessNamespace, ptr.Deref(d.Spec.Replicas, 1))
	}
	info := s.consumerInfo(ctx, t, js, stream)
	if info.NumAckPending == 0 {
		t.Fatalf("nothing is delivered and unacknowledged after the kill (%s): the crash did not leave a batch committed and not acknowledged", jsFacts(info))
	}
	committed := s.count(ctx, t, outageInbox)
	if committed == 0 {
		t.Fatalf("the inbox is empty after the kill (%s): no batch was committed before it", jsFacts(info))
	}
	atSuspend, err := s.tally(ctx, outageTable, outageInbox, e)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("OUTAGE killed pod %s (%s) %s after publishing; suspended (0 pods) %s later; committed-before-kill: %d inbox rows, %d effect rows, %d doubled; broker: %s",
		killed.Name, killInfo, killedAt.Sub(publishedAt).Round(100*time.Millisecond), suspendedAt.Sub(killedAt).Round(100*time.Millisecond),
		committed, atSuspend.rows, atSuspend.doubled, jsFacts(info))

	// 4. Stay suspended longer than maxConsumerOutage, the window and the
	// time after which a silent replica is gone; then prune.
	hold := max(outageMaxOutage, window, retention.StaleAfter) + 15*time.Second
	if d := hold - time.Since(suspendedAt); d > 0 {
		t.Logf("suspended; waiting %s (max(maxConsumerOutage %s, window %s, stale after %s) + 15s)", d.Round(time.Second), outageMaxOutage, window, retention.StaleAfter)
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(d):
		}
	}
	s.logProgress(ctx, t)
	job1, logs1 := s.runPruneJob(ctx, t, idc, outageName+"-manual-1")
	line1 := pruneFinished(t, logs1)
	if line1["heldBack"] != true || num(line1["rowsDeleted"]) != 0 {
		t.Fatalf("prune during the suspension: heldBack=%v rowsDeleted=%v, want true and 0: %v", line1["heldBack"], line1["rowsDeleted"], line1)
	}
	heldReason, _ := line1["heldReason"].(string)
	if !strings.Contains(heldReason, killed.Name) || !strings.Contains(fmt.Sprint(line1["heldBy"]), killed.Name) {
		t.Fatalf("the job's heldReason/heldBy do not name the killed replica %s: heldBy=%v heldReason=%q", killed.Name, line1["heldBy"], heldReason)
	}
	if kept := s.count(ctx, t, outageInbox); kept != committed {
		t.Fatalf("the prune run during the suspension deleted inbox rows: %d before, %d after", committed, kept)
	}
	held := s.waitLastPrune(ctx, t, idc, job1, func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		return localcluster.Condition(idc, messagingv1alpha1.ConditionReady) == "True/"+messagingv1alpha1.ReasonPruneHeldBack
	})
	lp := held.Status.LastPrune
	switch {
	case lp.RowsDeleted != 0:
		t.Fatalf("status.lastPrune.rowsDeleted=%d during the suspension", lp.RowsDeleted)
	case lp.HeldBack == "" || !strings.Contains(lp.HeldBack, killed.Name):
		t.Fatalf("status.lastPrune.heldBack %q does not name the killed replica %s", lp.HeldBack, killed.Name)
	case lp.HeldSince == nil || lp.WindowCutoff == nil || lp.Cutoff == nil || !lp.Cutoff.Before(lp.WindowCutoff):
		t.Fatalf("status.lastPrune: heldSince %v cutoff %v windowCutoff %v: want a cutoff held before the window's", lp.HeldSince, lp.Cutoff, lp.WindowCutoff)
	}
	if c := localcluster.Condition(held, messagingv1alpha1.ConditionPruneScheduled); c != "True/"+messagingv1alpha1.ReasonPruneHeldBack {
		t.Fatalf("PruneScheduled %s, want True/PruneHeldBack:\n%s", c, localcluster.RenderConditions(held))
	}
	wide, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "get", "idc", outageName, "-o", "wide")
	if err != nil || !strings.Contains(wide, messagingv1alpha1.ReasonPruneHeldBack) {
		t.Fatalf("kubectl get idc -o wide does not show PruneHeldBack (%v):\n%s", err, wide)
	}
	t.Logf("OUTAGE prune 1 (suspended %s): rowsDeleted=0, rows kept %d of %d, heldFor=%v heldSince=%s cutoff=%s windowCutoff=%s brokerCalls=%v progressCheckMs=%v",
		time.Since(suspendedAt).Round(time.Second), s.count(ctx, t, outageInbox), committed, line1["heldFor"], lp.HeldSince.UTC().Format(time.RFC3339),
		lp.Cutoff.UTC().Format(time.RFC3339), lp.WindowCutoff.UTC().Format(time.RFC3339), line1["brokerCalls"], line1["progressCheckMs"])
	t.Logf("OUTAGE status.lastPrune.heldBack: %s", lp.HeldBack)
	t.Logf("kubectl get idc -o wide:\n%s\nconditions:\n%s", wide, localcluster.RenderConditions(held))

	// 5. Resume: the broker redelivers what the killed replica committed
	// and never acknowledged; the inbox turns each into a skip.
	s.update(ctx, t, idc, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Suspend = false })
	resumedAt := time.Now()
	s.waitReady(ctx, t, idc, 1)
	v := s.waitApplied(ctx, t, outageTable, outageInbox, e, 4*time.Minute)
	dctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	drained, err := localcluster.WaitDrained(dctx, js, stream, outageName, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, err = s.tally(ctx, outageTable, outageInbox, e); err != nil {
		t.Fatal(err)
	}
	pods, err := s.c.ConsumerPods(ctx, idc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods {
		if hasFailpoint(&pods[i]) {
			t.Fatalf("pod %s resumed with the failpoint armed", pods[i].Name)
		}
	}
	m, _ := localcluster.Metrics(ctx, pods)
	t.Logf("OUTAGE resumed: all %d ids applied and the consumer drained %s after resuming; published=%d unique=%d rows=%d doubled=%d lost=%d phantom=%d; resumed pod skipped %v duplicates; broker: %s",
		v.unique, time.Since(resumedAt).Round(time.Second), len(e.sends), v.unique, v.rows, v.doubled, v.lost, v.phantom,
		m["idc_duplicates_skipped_total"], jsFacts(drained))
	if !v.ok() {
		t.Fatalf("after the suspension: not exactly one effect per id: %+v", v)
	}

	// The broker shows everything settled: the next run is not held back.
	job2, logs2 := s.runPruneJob(ctx, t, idc, outageName+"-manual-2")
	line2 := pruneFinished(t, logs2)
	if line2["heldBack"] != false {
		t.Fatalf("prune after the consumer drained is still held back: %v", line2)
	}
	released := s.waitLastPrune(ctx, t, idc, job2, func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		return localcluster.Condition(idc, messagingv1alpha1.ConditionReady) == "True/"+messagingv1alpha1.ReasonReady
	})
	lp = released.Status.LastPrune
	if lp.HeldBack != "" || lp.HeldSince != nil {
		t.Fatalf("status.lastPrune after the consumer drained: heldBack %q heldSince %v", lp.HeldBack, lp.HeldSince)
	}
	if c := localcluster.Condition(released, messagingv1alpha1.ConditionPruneScheduled); c != "True/"+messagingv1alpha1.ReasonScheduled {
		t.Fatalf("PruneScheduled %s after the hold ended:\n%s", c, localcluster.RenderConditions(released))
	}
	after, err := s.tally(ctx, outageTable, outageInbox, e)
	if err != nil {
		t.Fatal(err)
	}
	if !after.ok() {
		t.Fatalf("after the second prune: %+v", after)
	}
	t.Logf("OUTAGE prune 2 (drained): heldBack=false rowsDeleted=%d inbox rows left %d; Ready %s; step took %s (armed->kill %s, suspended %s)",
		lp.RowsDeleted, s.count(ctx, t, outageInbox), localcluster.Condition(released, messagingv1alpha1.ConditionReady),
		time.Since(stepStart).Round(time.Second), killedAt.Sub(armedAt).Round(100*time.Millisecond), resumedAt.Sub(suspendedAt).Round(time.Second))
}

// cleanupOutage deletes the step's resource (its inbox tables go with it:
// deletionPolicy Delete), stream and effect table. After a failure the
// resource stays until the suite ends, for the dump.
func (s *suite) cleanupOutage(t *testing.T, idc *messagingv1alpha1.IdempotentConsumer, js jetstream.JetStream, stream string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	remove := func() {
		if err := s.c.Client.Delete(ctx, idc); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("deleting %s: %v", idc.Name, err)
		}
		_ = localcluster.Eventually(ctx, 2*time.Minute, func() error {
			err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(idc), &messagingv1alpha1.IdempotentConsumer{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("%s still there (%w)", idc.Name, err)
		})
		_ = js.DeleteStream(ctx, stream)
		if conn, err := pgx.Connect(ctx, s.dsn()); err == nil {
			_, _ = conn.Exec(ctx, "DROP TABLE IF EXISTS e2e."+outageTable)
			_ = conn.Close(ctx)
		}
	}
	if t.Failed() {
		// The parent's JetStream connection is closed by then: use a new one.
		s.parent.Cleanup(func() {
			nc, js2, err := localcluster.ConnectJetStream()
			if err == nil {
				defer nc.Close()
				js = js2
			}
			remove()
		})
		return
	}
	remove()
}
