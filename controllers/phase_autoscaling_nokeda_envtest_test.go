package controllers

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// generationObserved succeeds once a pass without error observed the
// resource's current generation (status.observedGeneration, stamped with
// every condition's at the end of the pass): what a test asserts after an
// update is then what that pass did, not what an earlier one left.
func generationObserved(name string) func() error {
	return func() error {
		idc := get(name)
		if idc.Status.ObservedGeneration != idc.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", idc.Status.ObservedGeneration, idc.Generation)
		}
		for _, c := range idc.Status.Conditions {
			if c.ObservedGeneration != idc.Generation {
				return fmt.Errorf("condition %s observed generation %d, generation %d", c.Type, c.ObservedGeneration, idc.Generation)
			}
		}
		return nil
	}
}

// The suite's API server has no KEDA CRDs (TestKEDAObjectsPerSourceKind...
// runs its own with them).
var _ = Describe("autoscaling without KEDA", func() {
	It("says KEDANotInstalled, runs max(minReplicas, 1) replicas and keeps the limits at maxReplicas", func() {
		name := "nokeda-" + randomSuffix()
		stream := newStream(24 * time.Hour)
		newSecret(name+"-db", testDSN)
		idc := newConsumer(name, stream, name+"-db")
		idc.Spec.Runtime.Replicas = nil
		idc.Spec.Runtime.Autoscaling = &messagingv1alpha1.AutoscalingSpec{MaxReplicas: 3}
		create(idc)

		Eventually(condition(name, messagingv1alpha1.ConditionAutoscaling), timeout, interval).Should(Equal("False/" + messagingv1alpha1.ReasonKEDANotInstalled))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionAutoscaling)).To(ContainSubstring("KEDA is not installed"))
		// The API server defaulted minReplicas to 1.
		Eventually(func() int32 { return ptr.Deref(deployment(name).Spec.Replicas, -1) }, timeout, interval).Should(Equal(int32(1)))
		// minReplicas 0 without KEDA still runs one: nothing would wake it.
		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) {
			idc.Spec.Runtime.Autoscaling.MinReplicas = ptr.To(int32(0))
		})
		// The pass that saw minReplicas 0 wrote the Deployment before it
		// stamped its generation.
		Eventually(generationObserved(name), timeout, interval).Should(Succeed())
		Expect(ptr.Deref(deployment(name).Spec.Replicas, -1)).To(Equal(int32(1)))
		st := get(name).Status.Runtime
		Expect(ptr.Deref(st.DesiredReplicas, -1)).To(Equal(int32(1)))
		Expect(st.ScaleReason).To(Equal("KEDA is not installed: fixed at max(minReplicas, 1) = 1"))
		Consistently(func() int32 { return ptr.Deref(deployment(name).Spec.Replicas, -1) }, 2*time.Second, interval).Should(Equal(int32(1)))
	})

	It("refuses replicas together with autoscaling, and minReplicas above maxReplicas, naming the fields", func() {
		idc := newConsumer("refused-"+randomSuffix(), "S", "db")
		idc.Spec.Runtime.Replicas = ptr.To(int32(3))
		idc.Spec.Runtime.Autoscaling = &messagingv1alpha1.AutoscalingSpec{MaxReplicas: 4}
		err := k8sClient.Create(ctx, idc)
		Expect(err).To(MatchError(ContainSubstring("spec.runtime.replicas")))
		Expect(err).To(MatchError(ContainSubstring("replicas and autoscaling exclude each other")))

		idc = newConsumer("refused-"+randomSuffix(), "S", "db")
		idc.Spec.Runtime.Replicas = nil
		idc.Spec.Runtime.Autoscaling = &messagingv1alpha1.AutoscalingSpec{MinReplicas: ptr.To(int32(5)), MaxReplicas: 4}
		err = k8sClient.Create(ctx, idc)
		Expect(err).To(MatchError(ContainSubstring("spec.runtime.autoscaling.minReplicas")))

		idc = newConsumer("refused-"+randomSuffix(), "S", "db")
		idc.Spec.Runtime.Replicas = nil
		idc.Spec.Runtime.Autoscaling = &messagingv1alpha1.AutoscalingSpec{MaxReplicas: 0}
		Expect(k8sClient.Create(ctx, idc)).To(MatchError(ContainSubstring("spec.runtime.autoscaling.maxReplicas")))

		idc = newConsumer("refused-"+randomSuffix(), "S", "db")
		idc.Spec.Runtime.Replicas = nil
		idc.Spec.Runtime.Autoscaling = &messagingv1alpha1.AutoscalingSpec{MaxReplicas: 2, PollingInterval: "500ms"}
		Expect(k8sClient.Create(ctx, idc)).To(MatchError(ContainSubstring("spec.runtime.autoscaling.pollingInterval")))
	})
})
