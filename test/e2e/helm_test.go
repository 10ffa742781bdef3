package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/idempotency-dev/idc-operator/internal/testenv"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

const (
	helmRelease   = "idc"
	helmNamespace = "idc-helm"
	// helmManager is the chart's manager Deployment for release "idc".
	helmManager = "idc-idc-operator"
)

// helm runs the helm binary `make helm` built against the node.
func (s *suite) helm(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, env.helm, append(args, "--kubeconfig", s.c.Kubeconfig)...)
	dir := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(dir, "cache"), "HELM_CONFIG_HOME="+filepath.Join(dir, "config"), "HELM_DATA_HOME="+filepath.Join(dir, "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// helmInstall: the platform team's way. The kustomize-installed manager is
// removed first (the CRD and the resources stay); `helm install` of the
// chart brings a manager that takes them over and a new resource goes
// Ready under it; `helm upgrade` to new values rolls the manager and leaves
// the consumers' pods alone; `helm uninstall` removes the manager and keeps
// the CRD and the resources, as documented.
func (s *suite) helmInstall(ctx context.Context, t *testing.T) {
	if _, err := s.c.KubectlCmd(ctx, "-n", localcluster.OperatorNamespace, "delete", "deployment", localcluster.ManagerDeployment, "--wait=true"); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: helmNamespace, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	if err := s.c.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	chart := filepath.Join(testenv.RepoRoot(), "charts", "idc-operator")
	repo, tag, _ := strings.Cut(env.image, ":")
	out := s.helm(ctx, t, "install", helmRelease, chart, "-n", helmNamespace,
		"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
		"--set", "extraArgs={--retention-period=10s}", "--wait", "--timeout", "3m")
	t.Logf("helm install:\n%s", out)
	if _, err := s.c.KubectlCmd(ctx, "-n", helmNamespace, "rollout", "status", "deployment/"+helmManager, "--timeout=180s"); err != nil {
		t.Fatal(err)
	}
	pods := s.helmManagerPods(ctx, t, 1)
	checkOnNode(t, pods)
	t.Logf("the Helm-installed manager:%s", localcluster.DescribePods(pods))

	// A sample goes Ready under the Helm-installed manager.
	idc := s.apply(ctx, t, appendManifest("helm-ledger", "events_dropped", fmt.Sprintf(
		"    natsJetStream: {url: %q, stream: %s, consumer: helm-ledger}", localcluster.PodNATSURL, "IDC_E2E_LEDGER_"+strings.ToUpper(s.suffix)), 1, ""))
	s.waitReady(ctx, t, idc, 1)

	// Upgrade: two replicas (leader election picks one) and an extra arg;
	// the consumers' pods are not touched.
	before := s.podUIDs(ctx, t, s.ledger.Name)
	out = s.helm(ctx, t, "upgrade", helmRelease, chart, "-n", helmNamespace, "--reuse-values",
		"--set", "replicaCount=2", "--set", "extraArgs={--retention-period=10s,--zap-log-level=debug}", "--wait", "--timeout", "3m")
	t.Logf("helm upgrade:\n%s", out)
	if _, err := s.c.KubectlCmd(ctx, "-n", helmNamespace, "rollout", "status", "deployment/"+helmManager, "--timeout=180s"); err != nil {
		t.Fatal(err)
	}
	pods = s.helmManagerPods(ctx, t, 2)
	for _, p := range pods {
		if !strings.Contains(strings.Join(p.Spec.Containers[0].Args, " "), "--zap-log-level=debug") {
			t.Fatalf("manager pod %s args %v: the upgrade's values are not in it", p.Name, p.Spec.Containers[0].Args)
		}
	}
	if after := s.podUIDs(ctx, t, s.ledger.Name); after != before {
		t.Fatalf("helm upgrade replaced the consumer's pods: %s -> %s", before, after)
	}
	s.waitReady(ctx, t, idc, 1)

	// Uninstall: the manager goes, the CRD and the resources stay.
	t.Logf("helm uninstall:\n%s", s.helm(ctx, t, "uninstall", helmRelease, "-n", helmNamespace, "--wait"))
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		var d appsv1.Deployment
		err := s.c.Client.Get(ctx, types.NamespacedName{Namespace: helmNamespace, Name: helmManager}, &d)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("manager Deployment still there (%w)", err)
	}); err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := s.c.Client.Get(ctx, types.NamespacedName{Name: "idempotentconsumers.messaging.idempotency.dev"}, &crd); err != nil {
		t.Fatalf("the CRD after helm uninstall: %v", err)
	}
	if got := s.get(ctx, t, idc); got.UID != idc.UID {
		t.Fatalf("helm-ledger was replaced")
	}
	t.Log("helm install, upgrade and uninstall: the CRD and the resources stay")
}

func (s *suite) helmManagerPods(ctx context.Context, t *testing.T, want int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		var d appsv1.Deployment
		if err := s.c.Client.Get(ctx, types.NamespacedName{Namespace: helmNamespace, Name: helmManager}, &d); err != nil {
			return err
		}
		all, err := s.c.Pods(ctx, helmNamespace, d.Spec.Selector.MatchLabels)
		if err != nil {
			return err
		}
		pods = pods[:0]
		for i, p := range all {
			if p.DeletionTimestamp == nil && localcluster.PodReady(&all[i]) {
				pods = append(pods, p)
			}
		}
		if len(pods) != want || len(all) != want {
			return fmt.Errorf("manager pods:%s", localcluster.DescribePods(all))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return pods
}

func (s *suite) podUIDs(ctx context.Context, t *testing.T, instance string) string {
	t.Helper()
	pods, err := s.c.Pods(ctx, testNamespace, map[string]string{"app.kubernetes.io/instance": instance, "app.kubernetes.io/component": "consumer"})
	if err != nil {
		t.Fatal(err)
	}
	uids := make([]string, 0, len(pods))
	for _, p := range pods {
		uids = append(uids, string(p.UID))
	}
	return strings.Join(uids, ",")
}
