package controllers

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// A consumer with more than one replica gets a PodDisruptionBudget of
// maxUnavailable 1 that selects exactly its pods, owned by the resource and
// labelled for the manager's cache; scaled to one replica, it goes.
func TestPodDisruptionBudgetForMultiReplicaConsumers(t *testing.T) {
	idc := unitConsumer() // 2 replicas
	h := newHarness(t, idc)
	h.pass()
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "shop", Name: "orders"}
	var pdb policyv1.PodDisruptionBudget
	if err := h.c.Get(ctx, key, &pdb); err != nil {
		t.Fatalf("no PodDisruptionBudget for 2 replicas: %v", err)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("maxUnavailable %v, want 1", pdb.Spec.MaxUnavailable)
	}
	if pdb.Labels[specs.LabelManagedBy] != specs.ManagedBy || !metav1.IsControlledBy(&pdb, got(t, h)) {
		t.Errorf("labels %v, owners %v: want the managed-by label (the cache selects on it) and the resource as controller", pdb.Labels, pdb.OwnerReferences)
	}
	var d appsv1.Deployment
	if err := h.c.Get(ctx, key, &d); err != nil {
		t.Fatal(err)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Fatalf("the budget's selector %v does not select the consumer pods %v (%v)", pdb.Spec.Selector, d.Spec.Template.Labels, err)
	}

	update := got(t, h)
	update.Spec.Runtime.Replicas = ptr.To(int32(1))
	if err := h.c.Update(ctx, update); err != nil {
		t.Fatal(err)
	}
	h.pass()
	if err := h.c.Get(ctx, key, &pdb); !apierrors.IsNotFound(err) {
		t.Fatalf("one replica: the budget is still there (%v); it would block every drain", err)
	}

	// Turned off in the manager: none, also for many replicas.
	h2 := newHarness(t, unitConsumer())
	h2.r.opts.NoPodDisruptionBudgets = true
	h2.pass()
	if err := h2.c.Get(ctx, key, &pdb); !apierrors.IsNotFound(err) {
		t.Fatalf("--pod-disruption-budgets=false: a budget exists (%v)", err)
	}
}

func got(t *testing.T, h *harness) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	var idc messagingv1alpha1.IdempotentConsumer
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &idc); err != nil {
		t.Fatal(err)
	}
	return &idc
}

// The consumer pods spread across nodes by default, softly; a user's
// topologySpreadConstraints replace the default; every runtime container
// requests ephemeral storage.
func TestDefaultSpreadAndEphemeralStorage(t *testing.T) {
	idc := unitConsumer()
	d := specs.Deployment(idc, mustRender(t, idc), "img", "h", specs.Workloads(idc)[0])
	tsc := d.Spec.Template.Spec.TopologySpreadConstraints
	if len(tsc) != 1 || tsc[0].TopologyKey != corev1.LabelHostname || tsc[0].WhenUnsatisfiable != corev1.ScheduleAnyway || tsc[0].MaxSkew != 1 {
		t.Fatalf("default spread %+v, want one soft spread across hostnames", tsc)
	}
	sel, _ := metav1.LabelSelectorAsSelector(tsc[0].LabelSelector)
	if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Fatalf("the spread's selector does not select the consumer pods")
	}
	res := d.Spec.Template.Spec.Containers[0].Resources
	req, lim := res.Requests[corev1.ResourceEphemeralStorage], res.Limits[corev1.ResourceEphemeralStorage]
	if req.IsZero() || lim.IsZero() || req.Cmp(lim) > 0 {
		t.Fatalf("resources %v: want an ephemeral-storage request below its limit", res)
	}
	mine := []corev1.TopologySpreadConstraint{{MaxSkew: 2, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.DoNotSchedule,
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}}}
	idc.Spec.Runtime.TopologySpreadConstraints = mine
	d = specs.Deployment(idc, mustRender(t, idc), "img", "h", specs.Workloads(idc)[0])
	if got := d.Spec.Template.Spec.TopologySpreadConstraints; len(got) != 1 || got[0].TopologyKey != "topology.kubernetes.io/zone" {
		t.Fatalf("with the user's constraints: %+v, want them alone", got)
	}
}

// mustRender is the runtime config the controller renders for idc, as
// the children's renderers take it.
func mustRender(t *testing.T, idc *messagingv1alpha1.IdempotentConsumer) *specs.RuntimeConfig {
	t.Helper()
	rc, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	return &rc.RuntimeConfig
}

// --network-policies: each consumer's pods may reach DNS and what the
// runtime dials: its database (from the DSN in the Secret) and its broker,
// an IP host by address and port, a host name by port; nothing else.
// Ingress is not restricted. (Rendered here; the controller-runtime fake
// client cannot apply a NetworkPolicy, the envtest spec "workload
// children" applies it to a real API server.)
func TestNetworkPolicyEgressToDatabaseAndBrokerOnly(t *testing.T) {
	idc := unitConsumer() // nats://127.0.0.1:4222
	rc := mustRender(t, idc)
	env := map[string]string{rc.Config.Sink.DSNEnv: "postgres://app:pw@db.shop.svc:5432/app"}
	np := specs.NetworkPolicy(idc, rc, func(k string) string { return env[k] })
	if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeEgress {
		t.Fatalf("policy types %v, want Egress alone", np.Spec.PolicyTypes)
	}
	type rule struct {
		to    string
		ports string
	}
	var rules []rule
	for _, e := range np.Spec.Egress {
		r := rule{to: "any"}
		for _, p := range e.To {
			r.to = p.IPBlock.CIDR
		}
		for _, p := range e.Ports {
			r.ports += string(*p.Protocol) + "/" + p.Port.String() + " "
		}
		rules = append(rules, r)
	}
	want := []rule{{"any", "UDP/53 TCP/53 "}, {"127.0.0.1/32", "TCP/4222 "}, {"any", "TCP/5432 "}}
	if len(rules) != len(want) {
		t.Fatalf("egress %+v, want %+v", rules, want)
	}
	for i := range want {
		if rules[i] != want[i] {
			t.Fatalf("egress %+v, want %+v", rules, want)
		}
	}
	sel, _ := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if !sel.Matches(labels.Set(specs.Labels(idc, specs.ComponentConsumer))) || !sel.Matches(labels.Set(specs.Labels(idc, specs.ComponentPrune))) {
		t.Fatal("the policy does not select the consumer and prune pods")
	}
	if np.Labels[specs.LabelManagedBy] != specs.ManagedBy {
		t.Fatal("no managed-by label: the manager's cache would not see it")
	}
}
