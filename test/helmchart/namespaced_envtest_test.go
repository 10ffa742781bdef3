package helmchart

import (
	"bytes"
	"context"
	"os"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// TestNamespacedManagerUnderChartRBAC runs the real manager against a real
// kube-apiserver (envtest, RBAC enforced) as the chart's ServiceAccount, with
// only the RBAC objects `helm template --set watchNamespaces={a}` renders and
// the cache options --watch-namespaces=a gives. A resource in a is
// reconciled; one in b is never touched, and the ServiceAccount cannot even
// read b: the manager works without any ClusterRole for the watched kinds.
func TestNamespacedManagerUnderChartRBAC(t *testing.T) {
	g := NewWithT(t)
	logs := &syncBuffer{}
	logf.SetLogger(zap.New(zap.WriteTo(logs), zap.UseDevMode(true)))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("manager log:\n%s", logs.String())
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	env, err := testenv.New()
	g.Expect(err).NotTo(HaveOccurred())
	env.CRDDirectoryPaths = []string{chartDir + "/crds"} // the chart's copy
	cfg, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred(), "starting envtest (KUBEBUILDER_ASSETS=bin/k8s/1.37.2-linux-amd64)")
	defer func() { _ = env.Stop() }()

	scheme := runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	g.Expect(messagingv1alpha1.AddToScheme(scheme)).To(Succeed())
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	g.Expect(err).NotTo(HaveOccurred())

	for _, ns := range []string{"a", "b", releaseNS} {
		g.Expect(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	}
	// Only the chart's ServiceAccount and RBAC; the Deployment's role is
	// played by the manager started below.
	applied := 0
	for _, o := range parseObjects(t, mustRender(t, "testdata/namespaced-values.yaml")) {
		switch o.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
			g.Expect(admin.Create(ctx, &o)).To(Succeed(), "creating %s %s", o.GetKind(), o.GetName())
			applied++
		}
	}
	g.Expect(applied).To(BeNumerically(">=", 5))

	asManager := rest.CopyConfig(cfg)
	asManager.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + releaseNS + ":idc-idc-operator"}
	saClient, err := client.New(asManager, client.Options{Scheme: scheme})
	g.Expect(err).NotTo(HaveOccurred())
	// RBAC is enforced, and the chart granted nothing outside a.
	err = saClient.List(ctx, &messagingv1alpha1.IdempotentConsumerList{}, client.InNamespace("b"))
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "listing IdempotentConsumers in b as the manager: want Forbidden, got %v", err)
	err = saClient.List(ctx, &messagingv1alpha1.IdempotentConsumerList{})
	g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "listing IdempotentConsumers cluster-wide as the manager: want Forbidden, got %v", err)

	namespaces, err := controllers.WatchNamespaces("a")
	g.Expect(err).NotTo(HaveOccurred())
	mgr, err := ctrl.NewManager(asManager, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		LeaderElection:          true, // through the chart's leader-election Role
		LeaderElectionID:        "idc-operator.messaging.idempotency.dev",
		LeaderElectionNamespace: releaseNS,
		Cache:                   controllers.CacheOptions(namespaces),
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(controllers.NewReconciler(mgr, controllers.Options{RuntimeImage: "idc-operator:test"}).SetupWithManager(mgr)).To(Succeed())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			g.Expect(err).NotTo(HaveOccurred(), "the manager stopped with an error")
		case <-time.After(30 * time.Second): // a hang guard, not a speed check
			t.Error("the manager did not stop after its context ended")
		}
	}()

	// b first, so it is not merely queued behind a.
	for _, ns := range []string{"b", "a"} {
		g.Expect(admin.Create(ctx, sample(t, ns))).To(Succeed())
	}
	// The Secret is missing on purpose: the controller reports it without a
	// database, which is all this test needs to see a reconcile.
	g.Eventually(func() string {
		idc := &messagingv1alpha1.IdempotentConsumer{}
		if err := admin.Get(ctx, client.ObjectKey{Namespace: "a", Name: "orders-projector"}, idc); err != nil {
			return err.Error()
		}
		if c := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionReady); c != nil {
			return c.Reason
		}
		return "no Ready condition"
	}, 60*time.Second, 200*time.Millisecond).Should(Equal(messagingv1alpha1.ReasonSecretNotFound))

	g.Consistently(func() []metav1.Condition {
		idc := &messagingv1alpha1.IdempotentConsumer{}
		g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: "b", Name: "orders-projector"}, idc)).To(Succeed())
		return idc.Status.Conditions
	}, 3*time.Second, 250*time.Millisecond).Should(BeEmpty(), "the resource in namespace b was reconciled by a manager watching only a")
	events := &corev1.EventList{}
	g.Expect(admin.List(ctx, events, client.InNamespace("b"))).To(Succeed())
	g.Expect(events.Items).To(BeEmpty(), "events were written in namespace b")
}

func sample(t *testing.T, ns string) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	raw, err := os.ReadFile("../../config/samples/messaging_v1alpha1_idempotentconsumer_jetstream_upsert.yaml")
	if err != nil {
		t.Fatal(err)
	}
	idc := &messagingv1alpha1.IdempotentConsumer{}
	if err := yaml.Unmarshal(raw, idc); err != nil {
		t.Fatal(err)
	}
	idc.Namespace = ns
	return idc
}

// syncBuffer collects the manager's log, shown when the test fails.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
