package controllers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// The workload children on a real API server: a PodDisruptionBudget for
// two replicas (gone at one) and, with --network-policies (on in this
// suite), the consumer's NetworkPolicy, both owned by the resource.
var _ = Describe("workload children", func() {
	It("applies a PodDisruptionBudget for more than one replica and the NetworkPolicy, and removes the budget at one replica", func() {
		name := "workload-" + randomSuffix()
		stream := newStream(24 * time.Hour)
		newSecret(name+"-db", testDSN)
		createOrdersTable("projections", "")
		create(newConsumer(name, stream, name+"-db")) // 2 replicas
		key := client.ObjectKey{Namespace: "default", Name: name}
		var pdb policyv1.PodDisruptionBudget
		Eventually(func() error { return k8sClient.Get(ctx, key, &pdb) }, timeout, interval).Should(Succeed())
		Expect(pdb.Spec.MaxUnavailable.IntValue()).To(Equal(1))
		Expect(metav1.GetControllerOf(&pdb).Name).To(Equal(name))
		var np networkingv1.NetworkPolicy
		Eventually(func() error { return k8sClient.Get(ctx, key, &np) }, timeout, interval).Should(Succeed())
		Expect(np.Spec.PolicyTypes).To(Equal([]networkingv1.PolicyType{networkingv1.PolicyTypeEgress}))
		Expect(len(np.Spec.Egress)).To(BeNumerically(">=", 3), "DNS, the broker and the database")

		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Runtime.Replicas = ptr.To(int32(1)) })
		Eventually(func() bool { return apierrors.IsNotFound(k8sClient.Get(ctx, key, &policyv1.PodDisruptionBudget{})) }, timeout, interval).Should(BeTrue())
	})
})
