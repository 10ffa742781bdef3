package podrunner

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1", "B_C": "two"}
	for in, want := range map[string]string{
		"$(A)":          "1",
		"x$(B_C)y":      "xtwoy",
		"$(MISSING)":    "$(MISSING)",
		"$$(A)":         "$(A)",
		"plain":         "plain",
		"$(A)-$(A)-$$x": "1-1-$x",
	} {
		if got := expand(in, vars); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRewriteArg(t *testing.T) {
	mounts := []mount{{containerPath: "/etc/idc/sub", localPath: "/l/sub"}, {containerPath: "/etc/idc", localPath: "/l/cfg"}, {containerPath: "/tmp", localPath: "/l/tmp"}}
	for in, want := range map[string]string{
		"/etc/idc/config.json":          "/l/cfg/config.json",
		"/etc/idc":                      "/l/cfg",
		"/etc/idc/sub/x":                "/l/sub/x",
		"--config=/etc/idc/config.json": "--config=/l/cfg/config.json",
		"/etc/idcx/config.json":         "/etc/idcx/config.json",
		"run":                           "run",
		"a=/etc/idc/x":                  "a=/etc/idc/x",
	} {
		if got := rewriteArg(in, mounts); got != want {
			t.Errorf("rewriteArg(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFieldRef(t *testing.T) {
	p := &podIdentity{name: "web-abc-12345", namespace: "ns", labels: map[string]string{"app": "web"}}
	for path, want := range map[string]string{
		"metadata.name": "web-abc-12345", "metadata.namespace": "ns", "status.podIP": "127.0.0.1", "metadata.labels['app']": "web",
	} {
		got, err := p.field(path)
		if err != nil || got != want {
			t.Errorf("field(%s) = %q, %v; want %q", path, got, err, want)
		}
	}
	if _, err := p.field("status.phase"); err == nil {
		t.Error("an unsupported fieldRef must fail")
	}
}

func TestDeploymentStatus(t *testing.T) {
	now := metav1.NewTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(2))}}
	cases := []struct {
		name      string
		ready     []bool
		available corev1.ConditionStatus
	}{
		{"all ready", []bool{true, true}, corev1.ConditionTrue},
		{"one of two ready: 25% of 2 rounds down to 0 unavailable", []bool{true, false}, corev1.ConditionFalse},
		{"none", nil, corev1.ConditionFalse},
	}
	for _, c := range cases {
		pods := make([]PodInfo, len(c.ready))
		for i, r := range c.ready {
			pods[i] = PodInfo{Phase: PhaseRunning, Ready: r}
		}
		st := deploymentStatus(d, pods, now)
		if st.ObservedGeneration != 3 || st.Replicas != int32(len(pods)) || st.Conditions[0].Status != c.available {
			t.Errorf("%s: status = %+v", c.name, st)
		}
	}
	// An unchanged status keeps its times, so it compares equal.
	d.Status = deploymentStatus(d, []PodInfo{{Ready: true}, {Ready: true}}, now)
	again := deploymentStatus(d, []PodInfo{{Ready: true}, {Ready: true}}, metav1.NewTime(now.Add(time.Hour)))
	if !again.Conditions[0].LastTransitionTime.Equal(&now) {
		t.Errorf("transition time moved: %v", again.Conditions[0].LastTransitionTime)
	}
}

func TestMaxUnavailable(t *testing.T) {
	three := intstr.FromInt32(3)
	d := &appsv1.Deployment{}
	if got := maxUnavailable(d, 4); got != 1 {
		t.Errorf("default for 4 replicas = %d, want 1", got)
	}
	d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxUnavailable: &three}
	if got := maxUnavailable(d, 2); got != 2 {
		t.Errorf("3 of 2 replicas = %d, want 2", got)
	}
}

func TestJobStatus(t *testing.T) {
	now := metav1.NewTime(time.Date(2030, 1, 1, 0, 0, 10, 0, time.UTC))
	started := metav1.NewTime(now.Add(-10 * time.Second))
	j := &batchv1.Job{}
	running := jobStatus(j, PodInfo{Phase: PhaseRunning, Ready: true}, started, false, now)
	if running.Active != 1 || *running.Ready != 1 || len(running.Conditions) != 0 || !running.StartTime.Equal(&started) {
		t.Errorf("running: %+v", running)
	}
	done := jobStatus(j, PodInfo{Phase: PhaseSucceeded, Failures: 1}, started, false, now)
	if done.Active != 0 || done.Succeeded != 1 || done.Failed != 1 || done.CompletionTime == nil ||
		done.Conditions[0].Type != batchv1.JobSuccessCriteriaMet || done.Conditions[1].Type != batchv1.JobComplete {
		t.Errorf("succeeded: %+v", done)
	}
	failed := jobStatus(j, PodInfo{Phase: PhaseRunning}, started, true, now)
	if failed.Active != 0 || failed.Failed != 1 || failed.Conditions[0].Type != batchv1.JobFailureTarget ||
		failed.Conditions[1].Type != batchv1.JobFailed || failed.Conditions[1].Reason != "DeadlineExceeded" {
		t.Errorf("deadline: %+v", failed)
	}
}

func TestLivenessTracker(t *testing.T) {
	start := time.Now()
	l := newLivenessTracker(&corev1.Probe{InitialDelaySeconds: 5, PeriodSeconds: 10, FailureThreshold: 2}, start)
	if l.due(start.Add(time.Second)) {
		t.Fatal("due before the initial delay")
	}
	if !l.due(start.Add(6*time.Second)) || l.record(errFake) {
		t.Fatal("the first failure must not kill")
	}
	if l.due(start.Add(7 * time.Second)) {
		t.Fatal("due before the period")
	}
	if !l.due(start.Add(17*time.Second)) || !l.record(errFake) {
		t.Fatal("the second consecutive failure must kill")
	}
}

var errFake = &probeError{}

type probeError struct{}

func (*probeError) Error() string { return "probe failed" }

func TestSchedule(t *testing.T) {
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "prune", Namespace: "default", UID: "cj-uid"},
		Spec: batchv1.CronJobSpec{Schedule: "*/30 * * * *", ConcurrencyPolicy: batchv1.ForbidConcurrent,
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{}}}},
	}
	c := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(cj).WithStatusSubresource(cj).Build()
	r := &Runner{opts: Options{Namespace: "default", Log: logr.Discard()}, c: c, crons: map[string]*cronState{}, jobs: map[types.UID]*jobRun{}, wake: make(chan struct{}, 1)}
	ctx := context.Background()
	at := func(hh, mm int) time.Time { return time.Date(2030, 1, 1, hh, mm, 0, 0, time.UTC) }
	jobs := func() int {
		var l batchv1.JobList
		if err := c.List(ctx, &l); err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	for _, step := range []struct {
		now  time.Time
		want int
	}{{at(10, 5), 0}, {at(10, 29), 0}, {at(10, 30), 1}, {at(10, 31), 1}, {at(11, 0), 2}} {
		if err := r.syncSchedule(ctx, cj, step.now); err != nil {
			t.Fatal(err)
		}
		if got := jobs(); got != step.want {
			t.Fatalf("at %s: %d jobs, want %d", step.now.Format("15:04"), got, step.want)
		}
	}
	var j batchv1.Job
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: fmt.Sprintf("prune-%d", at(10, 30).Unix()/60)}, &j); err != nil {
		t.Fatalf("the scheduled Job is named after its minute: %v", err)
	}
	if j.Annotations["cronjob.kubernetes.io/instantiate"] != "scheduled" || metav1.GetControllerOf(&j).Name != "prune" {
		t.Errorf("job metadata = %+v", j.ObjectMeta)
	}
}
