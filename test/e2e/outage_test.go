package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// suspendAfterCrash is issue 19's proof on the real node: a runtime pod is
// SIGKILLed between COMMIT and ack (the failpoint), the resource is
// suspended for longer than its short maxConsumerOutage and its whole
// derived window, and a prune Job runs meanwhile. Pruning by the window
// alone would delete the committed ids JetStream still holds unacknowledged,
// and the resumed consumer would apply them a second time. The Job holds
// back instead, and the hold shows in status.lastPrune, in the Ready reason
// (kubectl get idc -o wide) and the conditions; after resuming, every id has
// one effect and the next prune Job is not held back any more.
func (s *suite) suspendAfterCrash(ctx context.Context, t *testing.T) {
	nc, js, err := localcluster.ConnectJetStream()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// No MaxAge: the messages outlive the suspension; maxReplayAge bounds
	// the derived window instead (W = 20s + 5s).
	stream, subject := "IDC_E2E_OUTAGE_"+strings.ToUpper(s.suffix), "idc-e2e-"+s.suffix+".outage"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}}); err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	if err := s.execDB(ctx, "CREATE TABLE e2e.events_outage (event_id text NOT NULL, num int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	idc := s.apply(ctx, t, fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: outage-ledger}
spec:
  source:
    natsJetStream: {url: %q, stream: %s, consumer: outage-ledger}
  message:
    id: {jsonPath: $.eventId}
  sink:
    postgres: {connectionSecretRef: {name: e2e-db, key: dsn}, schema: e2e}
    inbox: {table: inbox_outage_ledger}
    effect:
      append: {table: events_outage, columns: {event_id: "@messageId", num: $.n}}
  delivery: {batchSize: 100, maxWait: 100ms}
  retention: {maxConsumerOutage: 10s, safetyMargin: 5s, maxReplayAge: 20s}
  runtime: {replicas: 1}
`, localcluster.PodNATSURL, stream))
	defer func() { _ = s.c.Client.Delete(context.Background(), idc) }()
	idc = s.waitReady(ctx, t, idc, 1)
	window, err := time.ParseDuration(idc.Status.Retention.Window)
	if err != nil || window <= 0 || window > time.Minute {
		t.Fatalf("window %q (%v), want under a minute: %s", idc.Status.Retention.Window, err, idc.Status.Retention.DerivedFrom)
	}
	t.Logf("derived window %s from %s", window, idc.Status.Retention.DerivedFrom)

	// 1. The runtime SIGKILLs itself after its first commit, before the ack.
	deploy := s.deployment(ctx, t, idc).Name
	if _, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "set", "env", "deployment/"+deploy, "IDC_FAILPOINT=after-commit-before-ack"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "rollout", "status", "deployment/"+deploy, "--timeout=3m"); err != nil {
		t.Fatal(err)
	}
	e := newEvents("out", 2000, 0.2, 5)
	for _, b := range e.sends {
		if _, err := js.PublishAsync(subject, b); err != nil {
			t.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	var info *jetstream.ConsumerInfo
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		pods, err := s.c.ConsumerPods(ctx, idc)
		if err != nil {
			return err
		}
		killed := false
		for _, p := range pods {
			for _, cs := range p.Status.ContainerStatuses {
				if term := cs.LastTerminationState.Terminated; term != nil && term.ExitCode == 137 {
					killed = true
				}
			}
		}
		if !killed {
			return fmt.Errorf("no runtime container killed at the failpoint yet:%s", localcluster.DescribePods(pods))
		}
		c, err := js.Consumer(ctx, stream, "outage-ledger")
		if err != nil {
			return err
		}
		if info, err = c.Info(ctx); err != nil {
			return err
		}
		if info.NumAckPending == 0 {
			return fmt.Errorf("nothing is ack pending")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()

	// 2. Suspend at once; the resumed pods run without the failpoint.
	s.update(ctx, t, idc, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Suspend = true })
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		pods, err := s.c.ConsumerPods(ctx, idc)
		if err == nil && len(pods) != 0 {
			err = fmt.Errorf("pods left:%s", localcluster.DescribePods(pods))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "set", "env", "deployment/"+deploy, "IDC_FAILPOINT-"); err != nil {
		t.Fatal(err)
	}
	atKill, err := s.tally(ctx, "events_outage", "inbox_outage_ledger", e)
	if err != nil {
		t.Fatal(err)
	}
	rows := s.countRows(ctx, t, "inbox_outage_ledger")
	if atKill.distinct == 0 || atKill.distinct >= len(e.unique) || rows != atKill.distinct {
		t.Fatalf("at the suspension: %+v, %d inbox rows; want some of %d ids committed, one row each", atKill, rows, len(e.unique))
	}
	t.Logf("killed at the failpoint and suspended: %d of %d ids committed, %d ack pending on JetStream", atKill.distinct, len(e.unique), info.NumAckPending)

	// 3. Suspended past maxConsumerOutage, the window and StaleAfter (30 s):
	// a prune Job holds back.
	time.Sleep(time.Until(killedAt.Add(max(2*window, 40*time.Second))))
	_, logs := s.runPruneJob(ctx, t, idc, "e2e-outage-prune-1")
	if !strings.Contains(logs, `"heldBack":true`) {
		t.Fatalf("the prune Job during the suspension did not hold back:\n%s", logs)
	}
	if n := s.countRows(ctx, t, "inbox_outage_ledger"); n != rows {
		t.Fatalf("the prune Job during the suspension deleted inbox rows: %d left of %d\n%s", n, rows, logs)
	}
	held := s.waitIDC(ctx, t, idc, "the hold in status", func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		lp := idc.Status.LastPrune
		return lp != nil && lp.HeldBack != "" && localcluster.Condition(idc, messagingv1alpha1.ConditionReady) == "True/"+messagingv1alpha1.ReasonPruneHeldBack
	})
	wide, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "get", "idc", idc.Name, "-o", "wide")
	if err != nil || !strings.Contains(wide, messagingv1alpha1.ReasonPruneHeldBack) {
		t.Fatalf("kubectl get idc -o wide does not show the hold (%v):\n%s", err, wide)
	}
	if c := localcluster.Condition(held, messagingv1alpha1.ConditionPruneScheduled); c != "True/"+messagingv1alpha1.ReasonPruneHeldBack {
		t.Fatalf("PruneScheduled = %s, want True/%s", c, messagingv1alpha1.ReasonPruneHeldBack)
	}
	t.Logf("suspended %s (window %s): kubectl get idc -o wide:\n%s\nstatus.lastPrune.heldBack: %s (since %s, cutoff %s, window cutoff %s)",
		time.Since(killedAt).Truncate(time.Second), window, wide, held.Status.LastPrune.HeldBack,
		held.Status.LastPrune.HeldSince, held.Status.LastPrune.Cutoff, held.Status.LastPrune.WindowCutoff)

	// 4. Resume: JetStream redelivers, the inbox dedupes.
	s.update(ctx, t, idc, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Suspend = false })
	v := s.waitApplied(ctx, t, "events_outage", "inbox_outage_ledger", e, 3*time.Minute)
	dctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := localcluster.WaitDrained(dctx, js, stream, "outage-ledger", nil); err != nil {
		t.Fatal(err)
	}
	if v, err = s.tally(ctx, "events_outage", "inbox_outage_ledger", e); err != nil {
		t.Fatal(err)
	}
	t.Logf("OUTAGE published=%d unique=%d applied=%d doubled=%d lost=%d phantom=%d", len(e.sends), v.unique, v.distinct, v.doubled, v.lost, v.phantom)
	if !v.ok() {
		t.Fatalf("after resuming: %+v", v)
	}

	// 5. The broker settled the dead replica's claims: the next Job is not
	// held back, and Ready's reason is Ready again.
	_, logs = s.runPruneJob(ctx, t, idc, "e2e-outage-prune-2")
	if !strings.Contains(logs, `"heldBack":false`) {
		t.Fatalf("the prune Job after resuming still held back:\n%s", logs)
	}
	s.waitIDC(ctx, t, idc, "the hold to leave status", func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		lp := idc.Status.LastPrune
		return lp != nil && lp.HeldBack == "" && localcluster.Condition(idc, messagingv1alpha1.ConditionReady) == "True/"+messagingv1alpha1.ReasonReady
	})
	t.Logf("after resuming, the prune Job is not held back and Ready is True/Ready")
}

// runPruneJob runs `kubectl create job --from=cronjob/…`, waits for its pod
// to succeed and returns the Job and the pod's log.
func (s *suite) runPruneJob(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer, job string) (*batchv1.Job, string) {
	t.Helper()
	if _, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "create", "job", job, "--from=cronjob/"+idc.Name+"-prune"); err != nil {
		t.Fatal(err)
	}
	var j batchv1.Job
	if err := localcluster.Eventually(ctx, 3*time.Minute, func() error {
		if err := s.c.Client.Get(ctx, client.ObjectKey{Namespace: testNamespace, Name: job}, &j); err != nil {
			return err
		}
		if j.Status.Failed > 0 {
			return fmt.Errorf("job %s failed: %+v", job, j.Status)
		}
		if j.Status.Succeeded != 1 {
			return fmt.Errorf("job %s: %+v", job, j.Status)
		}
		return nil
	}); err != nil {
		out, _ := s.c.KubectlCmd(ctx, "-n", testNamespace, "logs", "job/"+job)
		t.Fatalf("%v\nlogs:\n%s", err, out)
	}
	pods, err := s.c.Pods(ctx, testNamespace, map[string]string{"job-name": job})
	if err != nil || len(pods) != 1 || pods[0].Status.Phase != corev1.PodSucceeded {
		t.Fatalf("prune pod: %v%s", err, localcluster.DescribePods(pods))
	}
	out, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "logs", "job/"+job)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("prune Job %s completed:%s", job, localcluster.DescribePods(pods))
	return &j, out
}

// waitIDC waits (up to 2 minutes) until done holds for the live resource.
func (s *suite) waitIDC(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer, what string, done func(*messagingv1alpha1.IdempotentConsumer) bool) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	got, err := localcluster.WaitFor(wctx, s.c.Client, client.ObjectKeyFromObject(idc), done, nil)
	if err != nil {
		cur := s.get(ctx, t, idc)
		t.Fatalf("waiting for %s: %v; status %+v", what, err, cur.Status)
	}
	return got
}

func (s *suite) execDB(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, s.dsn())
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(ctx, sql)
	return err
}

func (s *suite) countRows(ctx context.Context, t *testing.T, table string) int {
	t.Helper()
	conn, err := pgx.Connect(ctx, s.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{"e2e", table}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
