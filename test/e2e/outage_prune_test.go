package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// runPruneJob runs `kubectl create job --from=cronjob/<name>-prune`, waits
// for its pod to succeed and returns the Job and the pod's log.
func (s *suite) runPruneJob(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer, job string) (*batchv1.Job, string) {
	t.Helper()
	start := time.Now()
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
	t.Logf("prune Job %s completed in %s:%s", job, time.Since(start).Round(100*time.Millisecond), localcluster.DescribePods(pods))
	return &j, out
}

// pruneFinished is the "Prune finished" line of a prune pod's log (one JSON
// object per line).
func pruneFinished(t *testing.T, logs string) map[string]any {
	t.Helper()
	for _, l := range strings.Split(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "Prune finished" {
			t.Logf("Prune finished: %s", l)
			return m
		}
	}
	t.Fatalf("no \"Prune finished\" line in the prune log:\n%s", logs)
	return nil
}

// waitLastPrune waits until the controller read the Job's run into
// status.lastPrune (it reads the last run at every pass, every
// --retention-period: 10 s in this suite, and a pass is what it takes; an
// annotation change would not start one) and cond holds.
func (s *suite) waitLastPrune(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer, j *batchv1.Job,
	cond func(*messagingv1alpha1.IdempotentConsumer) bool) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	got, err := localcluster.WaitFor(wctx, s.c.Client, client.ObjectKeyFromObject(idc), func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		lp := idc.Status.LastPrune
		return lp != nil && lp.Time != nil && !lp.Time.Before(j.Status.StartTime) && cond(idc)
	}, nil)
	if err != nil {
		t.Fatalf("%v\nstatus.lastPrune: %+v\n%s", err, got.Status.LastPrune, localcluster.RenderConditions(got))
	}
	t.Logf("the controller showed the run of %s %s after it completed", j.Name, time.Since(start).Round(100*time.Millisecond))
	return got
}
