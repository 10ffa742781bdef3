package controllers

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// brokerLimitGauge reads idc_broker_limit_too_small for one resource.
func brokerLimitGauge(name string) func() float64 {
	return func() float64 {
		families, err := ctrlmetrics.Registry.Gather()
		Expect(err).NotTo(HaveOccurred())
		for _, f := range families {
			if f.GetName() != "idc_broker_limit_too_small" {
				continue
			}
			for _, m := range f.GetMetric() {
				if labelValue(m, "name") == name && labelValue(m, "limit") == "max_ack_pending" {
					return m.GetGauge().GetValue()
				}
			}
		}
		return -1
	}
}

var _ = Describe("broker limits", func() {
	It("warns when an existing JetStream consumer's MaxAckPending cannot fill 4 replicas x 500, and clears once it is raised", func() {
		name := "limits-" + randomSuffix()
		stream := newStream(24 * time.Hour)
		newSecret(name+"-db", testDSN)
		_, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
			Durable: name, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 100,
		})
		Expect(err).NotTo(HaveOccurred())

		idc := newConsumer(name, stream, name+"-db")
		idc.Spec.Runtime.Replicas = ptr.To(int32(4))
		idc.Spec.Delivery.BatchSize = 500
		create(idc)

		Eventually(condition(name, messagingv1alpha1.ConditionBrokerLimits), timeout, interval).Should(Equal("False/" + messagingv1alpha1.ReasonBrokerLimitTooSmall))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionBrokerLimits)).To(And(
			ContainSubstring("MaxAckPending=100"), ContainSubstring("replicas (4) x batchSize (500) x inFlight (2) = 4000")))
		Eventually(eventsWithReason(name, messagingv1alpha1.ReasonBrokerLimitTooSmall), timeout, interval).Should(Equal(1))
		Expect(brokerLimitGauge(name)()).To(Equal(1.0))
		Expect(condition(name, messagingv1alpha1.ConditionReady)()).NotTo(HaveSuffix("/" + messagingv1alpha1.ReasonBrokerLimitTooSmall))

		info, err := js.Consumer(ctx, stream, name)
		Expect(err).NotTo(HaveOccurred())
		cc := info.CachedInfo().Config
		cc.MaxAckPending = 8000
		_, err = js.UpdateConsumer(ctx, stream, cc)
		Expect(err).NotTo(HaveOccurred())
		// A spec change makes the controller read the broker again at once.
		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Delivery.MaxAttempts = 4 })
		Eventually(condition(name, messagingv1alpha1.ConditionBrokerLimits), timeout, interval).Should(Equal("True/" + messagingv1alpha1.ReasonLimitsFit))
		Expect(brokerLimitGauge(name)()).To(Equal(0.0))
		Expect(eventsWithReason(name, messagingv1alpha1.ReasonBrokerLimitTooSmall)()).To(Equal(1), "one event per transition")
	})
})
