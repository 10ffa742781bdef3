package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	"github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

var testNow = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// orders is a Ready resource whose window the replay horizon decided.
func orders() *v1alpha1.IdempotentConsumer {
	lag := int64(7)
	at := func(d time.Duration) *metav1.Time { t := metav1.NewTime(testNow.Add(-d)); return &t }
	idc := &v1alpha1.IdempotentConsumer{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: "shop", Generation: 3, UID: "uid-1"},
		Status: v1alpha1.IdempotentConsumerStatus{
			ObservedGeneration: 3,
			Source:             "nats-jetstream stream ORDERS consumer orders",
			Guarantee:          v1alpha1.GuaranteeExactlyOnceEffect,
			Conditions: []metav1.Condition{
				{Type: "Ready", Status: "True", Reason: "Ready", Message: "the inbox is provisioned", LastTransitionTime: metav1.NewTime(testNow.Add(-5 * time.Minute))},
				{Type: "RetentionResolved", Status: "True", Reason: "Broker", Message: "window 49h", LastTransitionTime: metav1.NewTime(testNow.Add(-5 * time.Minute))},
			},
			Retention: &v1alpha1.RetentionStatus{
				Window: "49h", RedeliveryHorizon: "25m", ReplayHorizon: "48h", Source: v1alpha1.RetentionSourceBroker,
				DerivedFrom: "stream ORDERS max_age=48h retention=limits (broker); consumer orders ack_wait=30s max_deliver=5 backoff=[] (broker); " +
					"maxConsumerOutage=20m (spec); safetyMargin=1h (spec); maxReplayAge unset (spec); L=48h A=5m R_redeliver=min(L,A+O)=25m R_replay=48h",
				ObservedAt: at(time.Hour),
			},
			Inbox:       &v1alpha1.InboxStatus{Table: "app.inbox_orders", Layout: "Table", SchemaVersion: 3},
			Runtime:     &v1alpha1.RuntimeStatus{Deployment: "orders", Replicas: 2, ReadyReplicas: 1, Selector: "app.kubernetes.io/instance=orders,app.kubernetes.io/component=consumer"},
			Lag:         &lag,
			LastPrune:   &v1alpha1.PruneRunStatus{Time: at(3 * time.Hour), RowsDeleted: 1200, Cutoff: at(52 * time.Hour)},
			LastRedrive: &v1alpha1.RedriveRunStatus{Token: "t1", Phase: v1alpha1.RedriveSucceeded, Time: at(2 * time.Hour), Selected: 2, Unusable: 1, StillFailing: 1},
			Outbox:      &v1alpha1.OutboxStatus{Pending: 4, OldestAge: metav1.Duration{Duration: 3 * time.Second}},
		},
	}
	idc.Spec.Retention.MaxConsumerOutage = "20m"
	idc.Spec.Retention.SafetyMargin = "1h"
	idc.Spec.Emit = &v1alpha1.EmitSpec{}
	return idc
}

func pod(name string, ready bool, restarts int32) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Labels: map[string]string{"app.kubernetes.io/instance": "orders", "app.kubernetes.io/component": "consumer"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "runtime"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, StartTime: ptr.To(metav1.NewTime(testNow.Add(-10 * time.Minute))),
			ContainerStatuses: []corev1.ContainerStatus{{Name: "runtime", Ready: ready, RestartCount: restarts}}},
	}
}

// harness runs the plugin against a fake API server.
type harness struct {
	client client.WithWatch
	kube   *kubefake.Clientset
}

func newHarness(objs ...client.Object) *harness {
	c := fake.NewClientBuilder().WithScheme(scheme()).WithObjects(objs...).WithStatusSubresource(&v1alpha1.IdempotentConsumer{}, &batchv1.Job{}).Build()
	return &harness{client: c, kube: kubefake.NewClientset()}
}

func (h *harness) run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	root, a := newRootCommand(&out, &errOut, func() (*clients, error) {
		return &clients{client: h.client, kube: h.kube, namespace: "shop"}, nil
	})
	a.now, a.poll = func() time.Time { return testNow }, 10*time.Millisecond
	root.SetArgs(args)
	err := root.Execute()
	if err != nil {
		_, _ = errOut.WriteString("error: " + err.Error() + "\n")
	}
	return exitCode(err), out.String(), errOut.String()
}

func TestArgumentsAndExitCodes(t *testing.T) {
	h := newHarness(orders())
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"status"}, exitUsage, "exactly one NAME"},
		{[]string{"status", "a", "b"}, exitUsage, "exactly one NAME"},
		{[]string{"status", "orders", "-o", "xml"}, exitUsage, "-o must be json or yaml"},
		{[]string{"status", "orders", "--no-such-flag"}, exitUsage, "unknown flag"},
		{[]string{"frobnicate"}, exitUsage, "unknown command"},
		{[]string{"redrive", "orders", "--reason", "poison"}, exitUsage, "not a reason class"},
		{[]string{"deadletters", "orders", "--limit", "-1"}, exitUsage, "--limit"},
		{[]string{"deadletters", "orders", "--limit", "x"}, exitUsage, "invalid argument"},
		{[]string{"status", "missing"}, exitFailed, "not found"},
		{[]string{"explain-window", "missing"}, exitFailed, "not found"},
		{[]string{"status", "orders"}, exitOK, ""},
		{[]string{"version", "-o", "json"}, exitOK, ""},
		{[]string{"completion", "bash"}, exitOK, ""},
	} {
		code, _, stderr := h.run(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.err) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, stderr, tc.code, tc.err)
		}
	}
}

func TestStatusOnOneScreen(t *testing.T) {
	h := newHarness(orders(), pod("orders-a", true, 0), pod("orders-b", false, 2))
	code, out, stderr := h.run(t, "status", "orders")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"IdempotentConsumer shop/orders (generation 3, observed 3)",
		"Sink:         postgres, schema public",
		"Window:       49h",
		"R_replay decided: the replay reach 48h is longer than redelivery 25m; window 49h = 48h + safetyMargin 1h",
		"Lag:          7 messages",
		"Last prune:   3h ago: 1200 rows deleted",
		`Last redrive: "t1" Succeeded 2h ago: 2 selected, 0 applied, 0 duplicates, 0 stale, 1 still failing, 1 without a usable id`,
		"Outbox:       4 pending, oldest 3s",
		"Ready              True    Ready",
		"Pods (Deployment orders, 1/2 ready):",
		"orders-a  1/1    Running  0         10m",
		"orders-b  0/1    Running  2         10m",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	noEmit := orders()
	noEmit.Spec.Emit, noEmit.Status.Outbox = nil, nil
	var plain strings.Builder
	if err := renderStatus(&plain, buildStatus(noEmit, nil), testNow); err != nil || !strings.Contains(plain.String(), "Outbox:       not used (no spec.emit") {
		t.Errorf("without spec.emit: %v\n%s", err, plain.String())
	}
	onMySQL := orders()
	onMySQL.Spec.Sink.MySQL = &v1alpha1.MySQLSpec{Database: "shop"}
	var my strings.Builder
	if err := renderStatus(&my, buildStatus(onMySQL, nil), testNow); err != nil || !strings.Contains(my.String(), "Sink:         mysql (MySQL/MariaDB), database shop\n") {
		t.Errorf("on MySQL: %v\n%s", err, my.String())
	}
	partitioned := orders()
	partitioned.Status.Partitions = []v1alpha1.PartitionStatus{
		{Partition: 0, Deployment: "orders-p0", Consumer: "orders-p0", Replicas: 2, ReadyReplicas: 2, Ready: true, Lag: ptr.To(int64(40))},
		{Partition: 1, Deployment: "orders-p1", Consumer: "orders-p1", Replicas: 2, ReadyReplicas: 1},
	}
	var parts strings.Builder
	if err := renderStatus(&parts, buildStatus(partitioned, nil), testNow); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Partitions:", "0          orders-p0   orders-p0  2/2                  40 messages", "1          orders-p1   orders-p1  1/2 (not available)  not read yet", "Pods (2 partitions' Deployments,"} {
		if !strings.Contains(parts.String(), want) {
			t.Errorf("partitioned status lacks %q:\n%s", want, parts.String())
		}
	}
	if n := strings.Count(out, "\n"); n > 40 {
		t.Errorf("status takes %d lines, more than one screen:\n%s", n, out)
	}

	_, js, _ := h.run(t, "status", "orders", "-o", "json")
	var rep statusReport
	if err := json.Unmarshal([]byte(js), &rep); err != nil {
		t.Fatalf("-o json is not JSON: %v\n%s", err, js)
	}
	if len(rep.Pods) != 2 || rep.Pods[1].Ready != "0/1" || rep.Sink != "postgres, schema public" || rep.Window.Window != "49h" || *rep.Lag != 7 || rep.LastRedrive.Token != "t1" {
		t.Errorf("-o json: %+v", rep)
	}
	_, ym, _ := h.run(t, "status", "orders", "-o", "yaml")
	var back statusReport
	if err := yaml.Unmarshal([]byte(ym), &back); err != nil || back.Name != "orders" || len(back.Conditions) != 2 {
		t.Errorf("-o yaml: %v %+v", err, back)
	}
}

func TestRedriveSetsTheAnnotationsAndWaits(t *testing.T) {
	h := newHarness(orders())
	ctx := context.Background()
	code, out, stderr := h.run(t, "redrive", "orders", "--reason", "invalid_json", "--id", "o-1", "--id", "o,2")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got := &v1alpha1.IdempotentConsumer{}
	if err := h.client.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "orders"}, got); err != nil {
		t.Fatal(err)
	}
	token := got.Annotations[v1alpha1.AnnotationRedrive]
	if !strings.HasPrefix(token, "kubectl-idc-20261202t120000z-") || got.Annotations[v1alpha1.AnnotationRedriveReason] != "invalid_json" ||
		got.Annotations[v1alpha1.AnnotationRedriveIDs] != `["o-1","o,2"]` || !strings.Contains(out, token) {
		t.Fatalf("annotations %v; output %q", got.Annotations, out)
	}

	// A second redrive has a fresh token and drops the earlier filter; the
	// controller (played here) ends it.
	var wg sync.WaitGroup
	wg.Add(1)
	stop := make(chan struct{})
	go func() {
		defer wg.Done()
		playController(t, h.client, token, stop, v1alpha1.RedriveSucceeded)
	}()
	code, out, stderr = h.run(t, "redrive", "orders", "--wait", "-o", "json")
	close(stop)
	wg.Wait()
	if code != exitOK {
		t.Fatalf("redrive --wait: exit %d: %s", code, stderr)
	}
	var req redriveRequest
	if err := json.Unmarshal([]byte(out), &req); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if req.Token == token || req.Outcome == nil || req.Outcome.Phase != v1alpha1.RedriveSucceeded || req.Outcome.Selected != 2 {
		t.Fatalf("redrive --wait: %+v", req)
	}
	if err := h.client.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "orders"}, got); err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Annotations[v1alpha1.AnnotationRedriveReason]; ok {
		t.Errorf("the reason of the earlier redrive stayed: %v", got.Annotations)
	}
}

func TestRedriveWaitFailsWhenTheRedriveFailed(t *testing.T) {
	h := newHarness(orders())
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		playController(t, h.client, "t1", stop, v1alpha1.RedriveFailed)
	}()
	code, out, stderr := h.run(t, "redrive", "orders", "--wait")
	close(stop)
	<-done
	if code != exitFailed || !strings.Contains(out, "Failed") || !strings.Contains(stderr, "the Job failed") {
		t.Errorf("exit %d; out %q; stderr %q", code, out, stderr)
	}
	code, _, stderr = h.run(t, "redrive", "orders", "--wait", "--timeout", "50ms")
	if code != exitFailed || !strings.Contains(stderr, "did not end within 50ms") {
		t.Errorf("a redrive nobody runs: exit %d, %q", code, stderr)
	}
}

// playController waits for a token other than prev and records its end.
func playController(t *testing.T, c client.Client, prev string, stop <-chan struct{}, phase v1alpha1.RedrivePhase) {
	ctx := context.Background()
	for {
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		idc := &v1alpha1.IdempotentConsumer{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "orders"}, idc); err != nil {
			t.Error(err)
			return
		}
		tok := idc.Annotations[v1alpha1.AnnotationRedrive]
		if tok == "" || tok == prev {
			continue
		}
		idc.Status.LastRedrive = &v1alpha1.RedriveRunStatus{Token: tok, Phase: phase, Job: "orders-redrive-x", Selected: 2, StillFailing: 1, Unusable: 1}
		if phase == v1alpha1.RedriveFailed {
			idc.Status.LastRedrive.Message = "the Job failed"
		}
		if err := c.Status().Update(ctx, idc); err != nil {
			continue
		}
		return
	}
}

func TestCompletionOffersTheResourcesAndReasons(t *testing.T) {
	other := orders()
	other.Name = "payments"
	h := newHarness(orders(), other)
	code, out, stderr := h.run(t, "__complete", "status", "")
	if code != exitOK || !strings.Contains(out, "orders\n") || !strings.Contains(out, "payments\n") {
		t.Errorf("completing NAME: exit %d, %q %q", code, out, stderr)
	}
	if _, out, _ := h.run(t, "__complete", "redrive", "orders", "--reason", ""); !strings.Contains(out, "invalid_json\n") {
		t.Errorf("completing --reason: %q", out)
	}
}
