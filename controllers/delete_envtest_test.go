package controllers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

var _ = Describe("deletion", func() {
	var name, stream string

	BeforeEach(func() {
		name = "del-" + randomSuffix()
		stream = newStream(24 * time.Hour)
		newSecret(name+"-db", testDSN)
	})

	It("drops the tables with deletionPolicy Delete", func() {
		idc := newConsumer(name, stream, name+"-db")
		idc.Spec.Sink.Inbox.DeletionPolicy = messagingv1alpha1.DeletionPolicyDelete
		create(idc)
		table := string(idc.Spec.Sink.Inbox.Table)
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		Expect(get(name).Finalizers).To(ContainElement(FinalizerDropInbox))
		Expect(tableExists("projections", table)).To(BeTrue())

		Expect(k8sClient.Delete(ctx, idc)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(idc), &messagingv1alpha1.IdempotentConsumer{}))
		}, timeout, interval).Should(BeTrue())
		for _, t := range []string{table, table + "_dead_letters", table + "_prune_runs"} {
			Expect(tableExists("projections", t)).To(BeFalse(), "table %s should be dropped", t)
		}
	})

	It("keeps the tables with deletionPolicy Retain and adds no finalizer", func() {
		idc := newConsumer(name, stream, name+"-db")
		create(idc)
		table := string(idc.Spec.Sink.Inbox.Table)
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		Expect(get(name).Finalizers).To(BeEmpty())
		Expect(k8sClient.Delete(ctx, idc)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(idc), &messagingv1alpha1.IdempotentConsumer{}))
		}, timeout, interval).Should(BeTrue())
		Expect(tableExists("projections", table)).To(BeTrue())
	})
})
