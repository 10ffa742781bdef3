package controllers

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// The API server's admission of natsJetStream.partitions: the range, no
// filterSubject beside it (each partition's filter is derived from the
// stream's transform), and neither the count nor its presence changes.
var _ = Describe("admission of natsJetStream.partitions", func() {
	partitioned := func(n int32) *messagingv1alpha1.IdempotentConsumer {
		idc := newConsumer("part-"+randomSuffix(), "PART", "part-db")
		idc.Spec.Source.NATSJetStream.FilterSubject = ""
		idc.Spec.Source.NATSJetStream.Partitions = ptr.To(n)
		return idc
	}

	It("accepts 2 to 64 and refuses the rest, naming the field", func() {
		for _, n := range []int32{2, 64} {
			Expect(k8sClient.Create(ctx, partitioned(n), client.DryRunAll)).To(Succeed(), "partitions %d", n)
		}
		for _, n := range []int32{0, 1, 65} {
			err := k8sClient.Create(ctx, partitioned(n), client.DryRunAll)
			Expect(err).To(HaveOccurred(), "partitions %d was accepted", n)
			Expect(err.Error()).To(ContainSubstring("spec.source.natsJetStream.partitions"))
		}
	})

	It("refuses filterSubject beside partitions", func() {
		idc := partitioned(4)
		idc.Spec.Source.NATSJetStream.FilterSubject = "orders.>"
		err := k8sClient.Create(ctx, idc, client.DryRunAll)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("filterSubject cannot be set with partitions"))
	})

	It("keeps the count and its presence as created", func() {
		idc := partitioned(4)
		Expect(k8sClient.Create(ctx, idc)).To(Succeed())
		DeferCleanup(func() { _ = k8sClient.Delete(ctx, idc) })

		changed := idc.DeepCopy()
		changed.Spec.Source.NATSJetStream.Partitions = ptr.To(int32(8))
		err := k8sClient.Update(ctx, changed)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("partitions is immutable"))

		removed := idc.DeepCopy()
		removed.Spec.Source.NATSJetStream.Partitions = nil
		err = k8sClient.Update(ctx, removed)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("partitions cannot be added or removed"))

		plain := newConsumer("plain-"+randomSuffix(), "PART", "part-db")
		Expect(k8sClient.Create(ctx, plain)).To(Succeed())
		DeferCleanup(func() { _ = k8sClient.Delete(ctx, plain) })
		added := plain.DeepCopy()
		added.Spec.Source.NATSJetStream.FilterSubject = ""
		added.Spec.Source.NATSJetStream.Partitions = ptr.To(int32(2))
		err = k8sClient.Update(ctx, added)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("partitions cannot be added or removed"))
	})
})
