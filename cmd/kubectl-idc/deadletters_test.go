package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// pruneCronJob is the controller's prune CronJob as far as the listing Job
// copies it.
func pruneCronJob() *batchv1.CronJob {
	return &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "orders-prune", Namespace: "shop"},
		Spec: batchv1.CronJobSpec{Schedule: "0 * * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app.kubernetes.io/instance": "orders", "app.kubernetes.io/component": "prune"}},
			Spec: corev1.PodSpec{
				RestartPolicy:                corev1.RestartPolicyOnFailure,
				AutomountServiceAccountToken: ptr.To(false),
				SecurityContext:              &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
				Containers: []corev1.Container{{
					Name: "prune", Image: "idc-operator:0.2.0", Command: []string{"/idc-runtime"}, Args: []string{"prune", "--config", "/etc/idc/config.json", "--window", "49h0m0s"},
					Env:             []corev1.EnvVar{{Name: "IDC_DSN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "orders-db"}, Key: "dsn"}}}},
					SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
				}},
				Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "orders-runtime"}}}}},
			},
		}}}},
	}
}

func TestDeadLettersJobIsThePruneJobWithAnotherCommand(t *testing.T) {
	cj := pruneCronJob()
	job, err := deadLettersJob(orders(), cj, deadLetterQuery{reason: "invalid_json", ids: []string{"o-1"}, limit: 10}, "orders-deadletters-abc")
	if err != nil {
		t.Fatal(err)
	}
	pod := job.Spec.Template.Spec
	ctr := pod.Containers[0]
	wantArgs := []string{"deadletters", "--config", "/etc/idc/config.json", "--limit", "10", "--reason", "invalid_json", "--id", "o-1"}
	if !slices.Equal(ctr.Args, wantArgs) || ctr.Name != "deadletters" || ctr.Image != "idc-operator:0.2.0" {
		t.Errorf("container %s %s %v", ctr.Name, ctr.Image, ctr.Args)
	}
	if ctr.Env[0].ValueFrom.SecretKeyRef.Name != "orders-db" || pod.Volumes[0].ConfigMap.Name != "orders-runtime" {
		t.Errorf("the Secret reference and the ConfigMap are not the resource's own: %+v %+v", ctr.Env, pod.Volumes)
	}
	if !*pod.SecurityContext.RunAsNonRoot || *ctr.SecurityContext.AllowPrivilegeEscalation || *pod.AutomountServiceAccountToken {
		t.Errorf("the restricted security context was not kept: %+v %+v", pod.SecurityContext, ctr.SecurityContext)
	}
	if pod.RestartPolicy != corev1.RestartPolicyNever || *job.Spec.BackoffLimit != 0 || job.Spec.TTLSecondsAfterFinished == nil || job.Spec.ActiveDeadlineSeconds == nil {
		t.Errorf("the Job is not short-lived: %+v", job.Spec)
	}
	if job.Labels["app.kubernetes.io/component"] != "deadletters" || job.Spec.Template.Labels["app.kubernetes.io/instance"] != "orders" {
		t.Errorf("labels %v / %v", job.Labels, job.Spec.Template.Labels)
	}
	if o := job.OwnerReferences; len(o) != 1 || o[0].UID != "uid-1" || o[0].Controller != nil {
		t.Errorf("owner references %+v: owned by the resource, not controlled", o)
	}
	if cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Name != "prune" {
		t.Error("the CronJob itself was changed")
	}
	if n := jobName(strings.Repeat("x", 63)); len(n) != 63 {
		t.Errorf("job name %q is %d long", n, len(n))
	}
}

func TestParseListingAmongLogLines(t *testing.T) {
	logs := `{"time":"2026-12-02T12:00:00Z","level":"INFO","msg":"something"}
{"kind":"DeadLetterList","inbox":"app.inbox_orders","total":2,"deadLetters":[{"id":1,"reasonClass":"missing_id","reason":"message id: missing","attempts":1,"deadAt":"2026-12-02T11:00:00Z"},{"id":2,"messageId":"poison-not-json","reasonClass":"invalid_json","reason":"invalid JSON payload","attempts":1,"deadAt":"2026-12-02T11:00:01Z"}]}
`
	l, in, err := parseListing(logs)
	if err != nil || in != "app.inbox_orders" || l.Total != 2 || l.DeadLetters[1].MessageID != "poison-not-json" {
		t.Fatalf("%+v %q %v", l, in, err)
	}
	if _, _, err := parseListing(`{"level":"ERROR","msg":"Command failed"}`); err == nil || !strings.Contains(err.Error(), "Command failed") {
		t.Errorf("a log without the listing: %v", err)
	}
	var out strings.Builder
	if err := renderDeadLetters(&out, deadLetterOutput{Name: "orders", Namespace: "shop", Inbox: in, DeadLetterListing: l}, deadLetterQuery{reason: "invalid_json"}, testNow); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 of 2 dead letters of shop/orders in app.inbox_orders (filter: reason invalid_json)", "ID  MESSAGE ID", "(none)", "poison-not-json  invalid_json  59m"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestDeadLettersRunsAndRemovesTheJob plays the Job controller: the Job
// completes, its pod's log is read (the fake clientset's log is "fake
// logs", which holds no listing), and the Job is deleted either way.
func TestDeadLettersRunsAndRemovesTheJob(t *testing.T) {
	h := newHarness(orders(), pruneCronJob())
	ctx := context.Background()
	stop := make(chan struct{})
	done := make(chan struct{})
	var seen *batchv1.Job
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var jobs batchv1.JobList
			if err := h.client.List(ctx, &jobs, client.InNamespace("shop")); err != nil || len(jobs.Items) == 0 {
				continue
			}
			j := jobs.Items[0]
			seen = j.DeepCopy()
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: j.Name + "-x", Namespace: "shop", Labels: map[string]string{batchv1.JobNameLabel: j.Name}}}
			_ = h.client.Create(ctx, p)
			_, _ = h.kube.CoreV1().Pods("shop").Create(ctx, p, metav1.CreateOptions{})
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
			if err := h.client.Status().Update(ctx, &j); err == nil {
				return
			}
		}
	}()
	code, _, stderr := h.run(t, "deadletters", "orders", "--reason", "missing_id")
	close(stop)
	<-done
	if code != exitFailed || !strings.Contains(stderr, "holds no listing") || !strings.Contains(stderr, "fake logs") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
	if seen == nil || !slices.Contains(seen.Spec.Template.Spec.Containers[0].Args, "missing_id") {
		t.Fatalf("no listing Job was created with the filter: %+v", seen)
	}
	var jobs batchv1.JobList
	if err := h.client.List(ctx, &jobs, client.InNamespace("shop")); err != nil || len(jobs.Items) != 0 {
		t.Errorf("the Job was left behind: %v %d", err, len(jobs.Items))
	}

	// Without the CronJob there is nothing to copy: named in the error.
	h = newHarness(orders())
	if code, _, stderr := h.run(t, "deadletters", "orders"); code != exitFailed || !strings.Contains(stderr, "orders-prune") {
		t.Errorf("no CronJob: exit %d, %q", code, stderr)
	}
}
