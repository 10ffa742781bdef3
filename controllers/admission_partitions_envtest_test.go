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

	// updated is the stored idc changed by mutate, as a dry-run merge patch
	// (no resourceVersion: the manager writes the resource meanwhile).
	updated := func(idc *messagingv1alpha1.IdempotentConsumer, mutate func(*messagingv1alpha1.NATSJetStreamSource)) error {
		GinkgoHelper()
		latest := &messagingv1alpha1.IdempotentConsumer{}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(idc), latest)).To(Succeed())
		changed := latest.DeepCopy()
		mutate(changed.Spec.Source.NATSJetStream)
		return k8sClient.Patch(ctx, changed, client.MergeFrom(latest), client.DryRunAll)
	}

	It("keeps the count and its presence as created", func() {
		idc := partitioned(4)
		Expect(k8sClient.Create(ctx, idc)).To(Succeed())
		DeferCleanup(func() { _ = k8sClient.Delete(ctx, idc) })

		err := updated(idc, func(j *messagingv1alpha1.NATSJetStreamSource) { j.Partitions = ptr.To(int32(8)) })
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("partitions is immutable"))

		err = updated(idc, func(j *messagingv1alpha1.NATSJetStreamSource) { j.Partitions = nil })
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("partitions cannot be added or removed"))

		plain := newConsumer("plain-"+randomSuffix(), "PART", "part-db")
		Expect(k8sClient.Create(ctx, plain)).To(Succeed())
		DeferCleanup(func() { _ = k8sClient.Delete(ctx, plain) })
		err = updated(plain, func(j *messagingv1alpha1.NATSJetStreamSource) { j.Partitions = ptr.To(int32(2)) })
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("partitions cannot be added or removed"))
	})
})
