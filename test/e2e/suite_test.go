package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// testNamespace enforces PodSecurity `restricted`: the API server itself
// proves every pod's security context.
const testNamespace = "idc-e2e"

// suite is the state shared by the ordered steps of TestRealNode.
type suite struct {
	c      *localcluster.Cluster
	suffix string
	// parent is TestRealNode's own T: what a step sets up for the later
	// steps (databases, streams, the kfake cluster) is cleaned up when the
	// whole suite ends, not when the step does.
	parent *testing.T
	// resources created by the steps, for the later ones.
	orders, ledger *messagingv1alpha1.IdempotentConsumer
	others         []*messagingv1alpha1.IdempotentConsumer
}

// TestRealNode runs the steps in order; a failed step stops the rest, since
// each builds on the one before.
func TestRealNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 32*time.Minute)
	defer cancel()
	c, err := localcluster.Connect(env.kubeconfig, env.kubectl)
	if err != nil {
		t.Fatal(err)
	}
	startSuiteNATS(ctx, t)
	if err := localcluster.CheckServices(ctx); err != nil {
		t.Fatalf("the e2e suite needs the local services: %v", err)
	}
	s := &suite{c: c, suffix: randomSuffix(), parent: t}
	steps := []struct {
		name string
		fn   func(context.Context, *testing.T)
	}{
		{"upgrade-from-previous-release", s.upgradeFromPrevious},
		{"helm-upgrade-from-previous-release", s.helmUpgradeFromPrevious},
		{"install", s.install},
		{"restricted-namespace", s.restrictedNamespace},
		{"metrics-authn-authz", s.metricsAuth},
		{"shipped-alerts-page-for-a-revoked-grant", s.shippedAlertsPage},
		{"jetstream-upsert-duplicates-and-reordering", s.jetStreamOrders},
		{"inbox-owned-across-namespaces", s.inboxOwnedAcrossNamespaces},
		{"autoscale-on-lag-with-keda", s.autoscaleOnLag},
		{"autoscale-from-zero-with-keda", s.autoscaleFromZero},
		{"jetstream-partitions-shared-keys", s.jetStreamPartitions},
		{"kubectl-idc-plugin", s.kubectlPlugin},
		{"every-broker-goes-ready", s.everyBroker},
		{"pipeline-emit-and-http-outbox", s.pipelineAndHTTPOutbox},
		{"pod-killed-under-load", s.podKilledUnderLoad},
		{"prune-cronjob", s.pruneCronJob},
		{"spec-change-rolls", s.specChangeRolls},
		{"manager-rollout-restart", s.managerRolloutRestart},
		{"suspend", s.suspend},
		{"suspend-after-a-crash-holds-pruning", s.suspendAfterCrash},
		{"gitops-health-of-live-resources", s.gitopsHealth},
		{"mysql-sink-upsert-prune-and-deletion", s.mysqlSink},
		{"deletion-policy", s.deletionPolicy},
		{"manager-rbac-never-forbidden", s.rbacNeverForbidden},
		{"helm-install-upgrade-uninstall", s.helmInstall},
	}
	only := selectedSteps()
	for _, st := range steps {
		if only != nil && !only[st.name] {
			continue
		}
		if !t.Run(st.name, func(t *testing.T) { st.fn(ctx, t) }) {
			s.dumpOnFailure(t, st.name)
			t.Fatalf("step %s failed; the later steps build on it", st.name)
		}
	}
}

// selectedSteps reads IDC_E2E_STEPS, a comma-separated list of step names
// to run alone (a step that builds on earlier ones then fails); unset runs
// every step.
func selectedSteps() map[string]bool {
	v := os.Getenv("IDC_E2E_STEPS")
	if v == "" {
		return nil
	}
	only := map[string]bool{}
	for _, name := range strings.Split(v, ",") {
		only[strings.TrimSpace(name)] = true
	}
	return only
}

func randomSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// dumpOnFailure logs what an on-call engineer would look at first.
// hack/e2e-failed.sh finds the step's own lines by the first line.
func (s *suite) dumpOnFailure(t *testing.T, step string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.Logf("=== the cluster when step %s failed", step)
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"-n", testNamespace, "get", "idc", "-o", "wide"},
		{"-n", testNamespace, "get", "events", "--sort-by=.lastTimestamp"},
		{"-n", localcluster.OperatorNamespace, "logs", "deployment/" + localcluster.ManagerDeployment, "--tail=80"},
	} {
		out, _ := s.c.KubectlCmd(ctx, args...)
		t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
	}
}

// apply creates the resource from YAML (what a user applies), in the test
// namespace.
func (s *suite) apply(ctx context.Context, t *testing.T, manifest string) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	idc := &messagingv1alpha1.IdempotentConsumer{}
	if err := yaml.UnmarshalStrict([]byte(manifest), idc); err != nil {
		t.Fatalf("parsing the manifest: %v\n%s", err, manifest)
	}
	idc.Namespace = testNamespace
	if err := s.c.Client.Create(ctx, idc); err != nil {
		t.Fatalf("applying %s: %v", idc.Name, err)
	}
	return idc
}

func (s *suite) secret(ctx context.Context, t *testing.T, name string, data map[string]string) {
	t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: name}, StringData: data}
	if err := s.c.Client.Create(ctx, sec); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// waitReady waits for Ready=True at the current generation and for every
// runtime pod to be Running and ready on the node, and logs the pods.
func (s *suite) waitReady(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer, replicas int) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	got, err := localcluster.WaitFor(wctx, s.c.Client, client.ObjectKeyFromObject(idc), localcluster.IsReady, nil)
	if err != nil {
		pods, _ := s.c.ConsumerPods(ctx, idc)
		t.Fatalf("%s: Ready: %v\npods:%s", idc.Name, err, localcluster.DescribePods(pods))
	}
	var pods []corev1.Pod
	if err := localcluster.Eventually(ctx, time.Minute, func() error {
		var err error
		if pods, err = s.c.ConsumerPods(ctx, idc); err != nil {
			return err
		}
		if len(pods) != replicas {
			return fmt.Errorf("%d pods, want %d:%s", len(pods), replicas, localcluster.DescribePods(pods))
		}
		for i := range pods {
			if !localcluster.PodReady(&pods[i]) {
				return fmt.Errorf("pod %s not ready:%s", pods[i].Name, localcluster.DescribePods(pods))
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("%s: %v", idc.Name, err)
	}
	checkOnNode(t, pods)
	t.Logf("%s Ready (%s); pods on the node:%s", idc.Name, localcluster.Condition(got, messagingv1alpha1.ConditionReady), localcluster.DescribePods(pods))
	return got
}

// checkOnNode: the pods run on the node, placed by the real scheduler, from
// the image `make image` built: the kubelet reports its ID (the digest of the
// image's config).
func checkOnNode(t *testing.T, pods []corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if p.Spec.NodeName != nodeName() || p.Spec.SchedulerName != corev1.DefaultSchedulerName {
			t.Fatalf("pod %s: node %q scheduler %q", p.Name, p.Spec.NodeName, p.Spec.SchedulerName)
		}
		scheduled := false
		for _, c := range p.Status.Conditions {
			scheduled = scheduled || (c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue)
		}
		if !scheduled || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].ImageID != env.imageID {
			t.Fatalf("pod %s: not scheduled, or not running the image make image built (%s):%s", p.Name, env.imageID, localcluster.DescribePods([]corev1.Pod{p}))
		}
	}
}

func nodeName() string { return "idc-node" }

func (s *suite) get(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	got := &messagingv1alpha1.IdempotentConsumer{}
	if err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(idc), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// update changes the resource, retrying on conflicts.
func (s *suite) update(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer, mutate func(*messagingv1alpha1.IdempotentConsumer)) {
	t.Helper()
	if err := localcluster.Eventually(ctx, 30*time.Second, func() error {
		cur := &messagingv1alpha1.IdempotentConsumer{}
		if err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(idc), cur); err != nil {
			return err
		}
		mutate(cur)
		return s.c.Client.Update(ctx, cur)
	}); err != nil {
		t.Fatalf("updating %s: %v", idc.Name, err)
	}
}

func (s *suite) deployment(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	if err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(idc), &d); err != nil {
		t.Fatal(err)
	}
	return &d
}
