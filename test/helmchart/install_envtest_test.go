package helmchart

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// TestHelmInstallUpgradeUninstall drives the real helm binary against a real
// kube-apiserver (envtest: no kubelet, so no pod runs; the real-node e2e
// suite covers that). It checks the API-side contract of the chart: install
// creates the CRD from crds/ and the manager; upgrade to new values changes
// the manager's Deployment and leaves the IdempotentConsumers alone;
// uninstall removes the manager and its RBAC and keeps the CRD and the
// resources, as the README documents.
func TestHelmInstallUpgradeUninstall(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()

	env, err := testenv.New()
	g.Expect(err).NotTo(HaveOccurred())
	env.CRDDirectoryPaths, env.ErrorIfCRDPathMissing = nil, false // helm installs it
	cfg, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred(), "starting envtest (KUBEBUILDER_ASSETS=bin/k8s/1.37.2-linux-amd64)")
	defer func() { _ = env.Stop() }()
	user, err := env.AddUser(envtest.User{Name: "helm", Groups: []string{"system:masters"}}, nil)
	g.Expect(err).NotTo(HaveOccurred())
	kubeconfig, err := user.KubeConfig()
	g.Expect(err).NotTo(HaveOccurred())
	kcPath := filepath.Join(t.TempDir(), "kubeconfig")
	g.Expect(os.WriteFile(kcPath, kubeconfig, 0o600)).To(Succeed())

	run := func(args ...string) string {
		t.Helper()
		out, err := helm(t, append(args, "--kubeconfig", kcPath)...)
		g.Expect(err).NotTo(HaveOccurred(), "helm %v:\n%s", args, out)
		return out
	}

	out := run("install", "idc", chartDir, "--namespace", releaseNS, "--create-namespace", "--set", "image.pullPolicy=Never")
	g.Expect(out).To(ContainSubstring("kubectl -n idc-system rollout status deployment/idc-idc-operator"), "NOTES.txt says how to check the install")

	scheme := runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	g.Expect(messagingv1alpha1.AddToScheme(scheme)).To(Succeed())
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	g.Expect(err).NotTo(HaveOccurred())

	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
	crdKey := client.ObjectKey{Name: "idempotentconsumers.messaging.idempotency.dev"}
	g.Expect(c.Get(ctx, crdKey, crd)).To(Succeed(), "helm install created the CRD from crds/")

	depKey := client.ObjectKey{Namespace: releaseNS, Name: "idc-idc-operator"}
	dep := &appsv1.Deployment{}
	g.Expect(c.Get(ctx, depKey, dep)).To(Succeed())
	g.Expect(*dep.Spec.Replicas).To(BeEquivalentTo(1))
	g.Expect(dep.Spec.Template.Spec.Containers[0].ImagePullPolicy).To(BeEquivalentTo("Never"))
	g.Expect(dep.Spec.Template.Spec.ServiceAccountName).To(Equal("idc-idc-operator"))
	g.Expect(c.Get(ctx, client.ObjectKey{Name: "idc-idc-operator-manager"}, &rbacv1.ClusterRole{})).To(Succeed())

	// A resource the manager would reconcile; the CRD is served (created
	// through the API, so the CRD's validation accepts the sample).
	g.Eventually(func() error { return c.Create(ctx, sample(t, "default")) }, "30s", "200ms").Should(Succeed())
	idcKey := client.ObjectKey{Namespace: "default", Name: "orders-projector"}
	before := &messagingv1alpha1.IdempotentConsumer{}
	g.Expect(c.Get(ctx, idcKey, before)).To(Succeed())

	run("upgrade", "idc", chartDir, "--namespace", releaseNS, "--reuse-values",
		"--set", "replicaCount=2", "--set", "extraArgs={--zap-log-level=debug}")
	g.Expect(c.Get(ctx, depKey, dep)).To(Succeed())
	g.Expect(*dep.Spec.Replicas).To(BeEquivalentTo(2))
	g.Expect(dep.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--zap-log-level=debug"), "the new args roll the manager's pods (a template change)")
	g.Expect(dep.Spec.Template.Spec.Containers[0].ImagePullPolicy).To(BeEquivalentTo("Never"), "--reuse-values kept the install's values")
	after := &messagingv1alpha1.IdempotentConsumer{}
	g.Expect(c.Get(ctx, idcKey, after)).To(Succeed())
	g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion), "helm upgrade touched an IdempotentConsumer")

	run("uninstall", "idc", "--namespace", releaseNS)
	g.Expect(apierrors.IsNotFound(c.Get(ctx, depKey, &appsv1.Deployment{}))).To(BeTrue(), "the manager Deployment is gone")
	g.Expect(apierrors.IsNotFound(c.Get(ctx, client.ObjectKey{Name: "idc-idc-operator-manager"}, &rbacv1.ClusterRole{}))).To(BeTrue(), "the manager's ClusterRole is gone")
	g.Expect(c.Get(ctx, crdKey, crd)).To(Succeed(), "helm uninstall keeps the CRD")
	g.Expect(c.Get(ctx, idcKey, after)).To(Succeed(), "helm uninstall keeps the IdempotentConsumers")
	list, err := helm(t, "list", "--namespace", releaseNS, "--short", "--kubeconfig", kcPath)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(slices.Contains([]string{"", "\n"}, list)).To(BeTrue(), "helm list after uninstall: %q", list)
}
