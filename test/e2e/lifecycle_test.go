package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// pruneCronJob: a Job made from the prune CronJob (what the CronJob
// controller does at its schedule; `kubectl create job --from` does it now)
// runs `idc-runtime prune` in a kubelet-run pod to completion, and the
// controller reads the run into status.lastPrune.
func (s *suite) pruneCronJob(ctx context.Context, t *testing.T) {
	j, _ := s.runPruneJob(ctx, t, s.orders, "e2e-prune-"+s.suffix)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	idc, err := localcluster.WaitFor(wctx, s.c.Client, client.ObjectKeyFromObject(s.orders), func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		lp := idc.Status.LastPrune
		return lp != nil && lp.Time != nil && !lp.Time.Before(j.Status.StartTime)
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	lp := idc.Status.LastPrune
	if lp.RowsDeleted != 0 {
		t.Fatalf("the prune deleted %d rows inside the window", lp.RowsDeleted)
	}
	t.Logf("status.lastPrune: time=%s cutoff=%s rowsDeleted=%d", lp.Time, lp.Cutoff, lp.RowsDeleted)
}

// specChangeRolls: a spec change that changes the runtime config replaces
// the pods (a real Deployment rollout), and Ready comes back.
func (s *suite) specChangeRolls(ctx context.Context, t *testing.T) {
	before, err := s.c.ConsumerPods(ctx, s.orders)
	if err != nil {
		t.Fatal(err)
	}
	old := map[string]bool{}
	for _, p := range before {
		old[p.Name] = true
	}
	s.update(ctx, t, s.orders, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Delivery.BatchSize = 250 })
	if err := localcluster.Eventually(ctx, 3*time.Minute, func() error {
		pods, err := s.c.ConsumerPods(ctx, s.orders)
		if err != nil {
			return err
		}
		if len(pods) != 2 {
			return fmt.Errorf("pods:%s", localcluster.DescribePods(pods))
		}
		for i, p := range pods {
			if old[p.Name] || !localcluster.PodReady(&pods[i]) {
				return fmt.Errorf("pods:%s", localcluster.DescribePods(pods))
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s.waitReady(ctx, t, s.orders, 2)
}

// managerRolloutRestart: `kubectl rollout restart` of the manager while
// resources change and a new one is created: the new manager takes the
// lease, every change is reconciled, and no child exists twice.
func (s *suite) managerRolloutRestart(ctx context.Context, t *testing.T) {
	oldPod := s.managerPod(ctx, t)
	if _, err := s.c.KubectlCmd(ctx, "-n", localcluster.OperatorNamespace, "rollout", "restart", "deployment/"+localcluster.ManagerDeployment); err != nil {
		t.Fatal(err)
	}
	// Changes made while the manager rolls.
	for _, idc := range s.others {
		s.update(ctx, t, idc, func(idc *messagingv1alpha1.IdempotentConsumer) {
			idc.Spec.Delivery.MaxWait = messagingv1alpha1.Duration("150ms")
		})
	}
	extra := s.apply(ctx, t, appendManifest("retained-ledger", "events_retained", fmt.Sprintf(
		"    natsJetStream: {url: %q, stream: %s, consumer: retained-ledger}", localcluster.PodNATSURL, "IDC_E2E_LEDGER_"+strings.ToUpper(s.suffix)), 1, ""))
	s.others = append(s.others, extra)
	if err := s.c.WaitManager(ctx); err != nil {
		t.Fatal(err)
	}
	newPod := s.managerPod(ctx, t)
	if newPod.Name == oldPod.Name {
		t.Fatalf("the manager pod %s was not replaced", oldPod.Name)
	}
	s.waitLeader(ctx, t, newPod.Name)
	for _, idc := range append([]*messagingv1alpha1.IdempotentConsumer{s.orders, s.ledger}, s.others...) {
		replicas := 1
		if idc == s.orders || idc == s.ledger {
			replicas = 2
		}
		got := s.waitReady(ctx, t, idc, replicas)
		if idc != s.orders && idc != s.ledger && idc.Name != extra.Name && got.Spec.Delivery.MaxWait != "150ms" {
			t.Fatalf("%s: maxWait %q", idc.Name, got.Spec.Delivery.MaxWait)
		}
		s.checkChildrenOnce(ctx, t, got)
	}
	// The changed config reached the pods' ConfigMap.
	for _, idc := range s.others[:3] {
		var cms corev1.ConfigMapList
		if err := s.c.Client.List(ctx, &cms, client.InNamespace(testNamespace), client.MatchingLabels{"app.kubernetes.io/instance": idc.Name}); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, cm := range cms.Items {
			for _, v := range cm.Data {
				found = found || strings.Contains(v, "150ms")
			}
		}
		if !found {
			t.Fatalf("%s: the update made during the manager's restart is not in its ConfigMap", idc.Name)
		}
	}
	t.Logf("manager %s replaced by %s; every resource Ready at its generation, each child once", oldPod.Name, newPod.Name)
}

// checkChildrenOnce: one Deployment, one CronJob, one ConfigMap per
// resource, all owned by it.
func (s *suite) checkChildrenOnce(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer) {
	t.Helper()
	count := func(list client.ObjectList) int {
		if err := s.c.Client.List(ctx, list, client.InNamespace(testNamespace)); err != nil {
			t.Fatal(err)
		}
		n := 0
		var objs []client.Object
		switch l := list.(type) {
		case *appsv1.DeploymentList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		case *batchv1.CronJobList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		case *corev1.ConfigMapList:
			for i := range l.Items {
				objs = append(objs, &l.Items[i])
			}
		}
		for _, o := range objs {
			for _, ref := range o.GetOwnerReferences() {
				if ref.UID == idc.UID {
					n++
				}
			}
		}
		return n
	}
	for kind, list := range map[string]client.ObjectList{"Deployment": &appsv1.DeploymentList{}, "CronJob": &batchv1.CronJobList{}, "ConfigMap": &corev1.ConfigMapList{}} {
		if n := count(list); n != 1 {
			t.Fatalf("%s owns %d %ss, want 1", idc.Name, n, kind)
		}
	}
}

// suspend: spec.suspend leaves 0 pods.
func (s *suite) suspend(ctx context.Context, t *testing.T) {
	s.update(ctx, t, s.orders, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Suspend = true })
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		d := s.deployment(ctx, t, s.orders)
		if ptr.Deref(d.Spec.Replicas, 1) != 0 || d.Status.Replicas != 0 {
			return fmt.Errorf("deployment replicas spec=%d status=%d", ptr.Deref(d.Spec.Replicas, 1), d.Status.Replicas)
		}
		// Terminating pods count too: the kubelet must have stopped them.
		var pl corev1.PodList
		if err := s.c.Client.List(ctx, &pl, client.InNamespace(testNamespace), client.MatchingLabels(d.Spec.Selector.MatchLabels)); err != nil {
			return err
		}
		if len(pl.Items) != 0 {
			return fmt.Errorf("pods left:%s", localcluster.DescribePods(pl.Items))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := localcluster.WaitFor(wctx, s.c.Client, client.ObjectKeyFromObject(s.orders), func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		return localcluster.Condition(idc, messagingv1alpha1.ConditionRuntimeReady) == "True/"+messagingv1alpha1.ReasonSuspended
	}, nil); err != nil {
		t.Fatal(err)
	}
	t.Log("suspended: the Deployment is at 0 replicas and no pod is left")
}

// deletionPolicy: deleting a resource with `deletionPolicy: Delete` drops
// its inbox tables (behind the finalizer); `Retain` (the default) keeps
// them. The garbage collector removes the children of both.
func (s *suite) deletionPolicy(ctx context.Context, t *testing.T) {
	dropped, retained := s.others[0], s.others[1] // rabbitmq-ledger (Delete), redis-ledger (Retain)
	if dropped.Spec.Sink.Inbox.DeletionPolicy != messagingv1alpha1.DeletionPolicyDelete {
		t.Fatalf("%s: deletionPolicy %q", dropped.Name, dropped.Spec.Sink.Inbox.DeletionPolicy)
	}
	for _, idc := range []*messagingv1alpha1.IdempotentConsumer{dropped, retained} {
		if err := s.c.Client.Delete(ctx, idc); err != nil {
			t.Fatal(err)
		}
	}
	for _, idc := range []*messagingv1alpha1.IdempotentConsumer{dropped, retained} {
		if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
			err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(idc), &messagingv1alpha1.IdempotentConsumer{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s still there (%w)", idc.Name, err)
			}
			pods, err := s.c.Pods(ctx, testNamespace, map[string]string{"app.kubernetes.io/instance": idc.Name})
			if err != nil {
				return err
			}
			if len(pods) != 0 {
				return fmt.Errorf("%s: pods left after deletion:%s", idc.Name, localcluster.DescribePods(pods))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pgx.Connect(ctx, s.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	exists := func(table string) bool {
		var ok bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", "e2e."+table).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if exists("inbox_rabbitmq_ledger") || exists("inbox_rabbitmq_ledger_dead_letters") {
		t.Fatal("deletionPolicy Delete: the inbox tables of rabbitmq-ledger are still there")
	}
	if !exists("inbox_redis_ledger") || !exists("inbox_redis_ledger_dead_letters") {
		t.Fatal("deletionPolicy Retain: the inbox tables of redis-ledger are gone")
	}
	if !exists("events_rabbitmq") {
		t.Fatal("the effect table (the user's) was dropped")
	}
	t.Log("Delete dropped the inbox tables, Retain kept them; the garbage collector removed the pods")
}
