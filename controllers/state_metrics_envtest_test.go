package controllers

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// managerSeries is what the manager's /metrics serves about one resource.
func managerSeries(name string) []string {
	families, err := ctrlmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	return seriesLines(families, name)
}

var _ = Describe("the manager's state metrics", func() {
	It("export each condition with status and reason, the replicas and the window, and drop a deleted resource", func() {
		name := "metrics-" + randomSuffix()
		newSecret(name+"-db", testDSN)
		idc := newConsumer(name, newStream(24*time.Hour), name+"-db")
		create(idc)
		Eventually(condition(name, messagingv1alpha1.ConditionRuntimeReady), timeout, interval).Should(Equal("False/" + messagingv1alpha1.ReasonDeploymentNotReady))
		markAvailable(name)
		Eventually(condition(name, messagingv1alpha1.ConditionReady), timeout, interval).Should(Equal("True/Ready"))

		Eventually(func() string { return strings.Join(managerSeries(name), "\n") }, timeout, interval).Should(And(
			ContainSubstring("idc_resource_condition{condition=Ready,name="+name+",namespace=default,reason=Ready,status=True} 1"),
			ContainSubstring("idc_resource_condition{condition=Stalled,name="+name+",namespace=default,reason=Ready,status=False} 1"),
			ContainSubstring("idc_resource_replicas_desired{name="+name+",namespace=default} 2"),
			ContainSubstring("idc_resource_replicas_ready{name="+name+",namespace=default} 2"),
			// The stream's max_age 24h plus the delivery terms.
			MatchRegexp(`idc_resource_retention_window_seconds\{name=`+name+`,namespace=default\} [1-9]`),
		))

		Expect(k8sClient.Delete(ctx, idc)).To(Succeed())
		Eventually(func() []string { return managerSeries(name) }, timeout, interval).Should(BeEmpty())
	})
})
