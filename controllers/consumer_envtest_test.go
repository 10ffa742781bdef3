package controllers

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

var _ = Describe("a JetStream -> PostgreSQL upsert consumer", func() {
	var name, stream, secret string

	BeforeEach(func() {
		name = "orders-" + randomSuffix()
		stream = newStream(48 * time.Hour)
		secret = name + "-db"
		newSecret(secret, testDSN)
	})

	It("becomes Ready with the tables provisioned and the children rendered field by field", func() {
		create(newConsumer(name, stream, secret))
		table := "inbox_" + strings.ReplaceAll(name, "-", "_")

		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		for _, t := range []string{table, table + "_dead_letters", table + "_prune_runs"} {
			Expect(tableExists("projections", t)).To(BeTrue(), "table %s", t)
		}
		Eventually(condition(name, messagingv1alpha1.ConditionRuntimeReady), timeout, interval).Should(Equal("False/DeploymentNotAvailable"))
		Expect(condition(name, messagingv1alpha1.ConditionReady)()).To(Equal("False/DeploymentNotAvailable"))
		Expect(condition(name, messagingv1alpha1.ConditionReconciling)()).To(Equal("True/DeploymentNotAvailable"))

		idc := get(name)
		Expect(idc.Status.Retention).NotTo(BeNil())
		// L = MaxAge 48h; no consumer yet: JetStream's defaults (MaxDeliver
		// unbounded), so R_redeliver = 48h, R_replay = 48h, W = 48h + 1h.
		Expect(idc.Status.Retention.Window).To(Equal("49h"))
		Expect(idc.Status.Retention.Source).To(Equal(messagingv1alpha1.RetentionSourceBroker))
		Expect(idc.Status.Retention.DerivedFrom).To(ContainSubstring(stream))
		Expect(idc.Status.Inbox).NotTo(BeNil())
		Expect(idc.Status.Inbox.Epoch).To(MatchRegexp(`^[0-9a-f]{32}$`))
		Expect(idc.Status.Inbox.Database).To(MatchRegexp(`^[0-9]+/idc_ctrl_test_`))
		Expect(idc.Status.Inbox).To(Equal(&messagingv1alpha1.InboxStatus{Table: "projections." + table, Layout: "Table", SchemaVersion: inbox.SchemaVersion,
			Epoch: idc.Status.Inbox.Epoch, Database: idc.Status.Inbox.Database}))
		Expect(idc.Status.Guarantee).To(Equal(messagingv1alpha1.GuaranteeExactlyOnceEffect))

		d := deployment(name)
		Expect(d.OwnerReferences).To(HaveLen(1))
		Expect(d.OwnerReferences[0].Name).To(Equal(name))
		Expect(*d.Spec.Replicas).To(Equal(int32(2)))
		pod := d.Spec.Template.Spec
		Expect(*pod.AutomountServiceAccountToken).To(BeFalse())
		Expect(*pod.SecurityContext.RunAsNonRoot).To(BeTrue())
		Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
		Expect(pod.Containers).To(HaveLen(1))
		c := pod.Containers[0]
		Expect(c.Image).To(Equal("idc-operator:test"))
		Expect(c.Command).To(Equal([]string{"/idc-runtime"}))
		Expect(c.Args).To(Equal([]string{"run", "--config", "/etc/idc/config.json"}))
		Expect(*c.SecurityContext.ReadOnlyRootFilesystem).To(BeTrue())
		Expect(*c.SecurityContext.AllowPrivilegeEscalation).To(BeFalse())
		Expect(c.SecurityContext.Capabilities.Drop).To(Equal([]corev1.Capability{"ALL"}))
		Expect(c.Ports).To(ContainElement(HaveField("Name", "metrics")))
		Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
		Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
		Expect(c.Resources.Requests.Cpu().String()).To(Equal("100m"))
		dsn := envByName(c, envPostgresDSN)
		Expect(dsn).NotTo(BeNil())
		Expect(dsn.Value).To(BeEmpty(), "credentials must come from secretKeyRef, never inline")
		Expect(dsn.ValueFrom.SecretKeyRef.Name).To(Equal(secret))
		Expect(dsn.ValueFrom.SecretKeyRef.Key).To(Equal("dsn"))
		Expect(d.Spec.Template.Annotations).To(HaveKey(specs.AnnotationConfigHash))
		Expect(d.Spec.Template.Annotations).To(HaveKey(specs.AnnotationSecretsHash))

		var cm corev1.ConfigMap
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-runtime"}, &cm)).To(Succeed())
		Expect(cm.Data[specs.ConfigKey]).To(ContainSubstring(`"dsnEnv":"IDC_POSTGRES_DSN"`))
		Expect(cm.Data[specs.ConfigKey]).NotTo(ContainSubstring("postgres://"), "the DSN must not be in the ConfigMap")

		cj := cronJob(name)
		Expect(cj.Spec.Schedule).To(Equal("*/30 * * * *"))
		Expect(cj.Spec.ConcurrencyPolicy).To(Equal(batchv1.ForbidConcurrent))
		Expect(*cj.Spec.Suspend).To(BeFalse())
		Expect(cj.Spec.StartingDeadlineSeconds).NotTo(BeNil())
		Expect(*cj.Spec.SuccessfulJobsHistoryLimit).To(Equal(int32(3)))
		jc := cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0]
		Expect(jc.Args).To(Equal([]string{"prune", "--config", "/etc/idc/config.json", "--window", "49h0m0s"}))
		Expect(*jc.SecurityContext.ReadOnlyRootFilesystem).To(BeTrue())
		Expect(*cj.Spec.JobTemplate.Spec.Template.Spec.AutomountServiceAccountToken).To(BeFalse())

		markAvailable(name)
		Eventually(condition(name, messagingv1alpha1.ConditionReady), timeout, interval).Should(Equal("True/Ready"))
		Expect(condition(name, messagingv1alpha1.ConditionReconciling)()).To(Equal("False/Ready"))
		Expect(condition(name, messagingv1alpha1.ConditionStalled)()).To(Equal("False/Ready"))
		Expect(condition(name, messagingv1alpha1.ConditionPruneScheduled)()).To(Equal("True/Scheduled"))
		Expect(condition(name, messagingv1alpha1.ConditionRetentionResolved)()).To(Equal("True/Broker"))
		idc = get(name)
		Expect(idc.Status.ObservedGeneration).To(Equal(idc.Generation))
		Expect(idc.Status.Runtime.ReadyReplicas).To(Equal(int32(2)))
		Expect(idc.Status.Runtime.Selector).To(ContainSubstring("app.kubernetes.io/instance=" + name))

		row := tableRow(name)
		Expect(row["Ready"]).To(Equal("True"))
		Expect(row["Source"]).To(Equal("NATSJetStream " + stream + "/" + name))
		Expect(row["Window"]).To(Equal("49h"))
		Expect(row).To(HaveKey("Last Prune"))
		Expect(row["Age"]).NotTo(BeEmpty())

		By("writing nothing once Ready: a pass over an unchanged world patches neither status nor children")
		idcVersion, depVersion := get(name).ResourceVersion, deployment(name).ResourceVersion
		cmVersion := configMapVersion(name)
		before := reconcileTotal()
		// A Secret change that touches no referenced key makes the controller
		// look again without changing anything it renders.
		setSecretData(secret, map[string]string{"dsn": testDSN, "unrelated": randomSuffix()})
		Eventually(reconcileTotal, timeout, interval).Should(BeNumerically(">", before))
		Expect(get(name).ResourceVersion).To(Equal(idcVersion), "status was written by a pass that changed nothing")
		Expect(deployment(name).ResourceVersion).To(Equal(depVersion), "the Deployment was written by a pass that changed nothing")
		Expect(configMapVersion(name)).To(Equal(cmVersion), "the ConfigMap was written by a pass that changed nothing")
	})

	It("rolls the pods on a spec change and on Secret rotation, and scales to 0 on suspend", func() {
		create(newConsumer(name, stream, secret))
		Eventually(podAnnotation(name, specs.AnnotationConfigHash), timeout, interval).ShouldNot(BeEmpty())
		configHash := deployment(name).Spec.Template.Annotations[specs.AnnotationConfigHash]
		secretsHash := deployment(name).Spec.Template.Annotations[specs.AnnotationSecretsHash]

		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Delivery.BatchSize = 1000 })
		Eventually(podAnnotation(name, specs.AnnotationConfigHash), timeout, interval).ShouldNot(Equal(configHash))
		Expect(deployment(name).Spec.Template.Annotations[specs.AnnotationSecretsHash]).To(Equal(secretsHash))

		setSecretData(secret, map[string]string{"dsn": testDSN + "&application_name=rotated"})
		Eventually(podAnnotation(name, specs.AnnotationSecretsHash), timeout, interval).ShouldNot(Equal(secretsHash))

		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Suspend = true })
		Eventually(func() int32 { return *deployment(name).Spec.Replicas }, timeout, interval).Should(Equal(int32(0)))
		Eventually(condition(name, messagingv1alpha1.ConditionRuntimeReady), timeout, interval).Should(Equal("True/Suspended"))
		Expect(condition(name, messagingv1alpha1.ConditionReady)()).To(Equal("True/Suspended"))
		Expect(*cronJob(name).Spec.Suspend).To(BeFalse(), "pruning goes on while the runtime is suspended")
	})

	It("follows the broker: a growing window applies at once, a shrinking one waits for the old window", func() {
		create(newConsumer(name, stream, secret))
		Eventually(windowOf(name), timeout, interval).Should(Equal("49h"))

		// Rotating the referenced Secret key makes the controller read the
		// broker again at once (a reading depends on the Secrets). The prune
		// CronJob carries both the secrets hash and the window in force, in
		// one write: once its hash moved, its --window is that pass's.
		cronHash := func() string {
			return cronJob(name).Spec.JobTemplate.Spec.Template.Annotations[specs.AnnotationSecretsHash]
		}
		nudge := func() {
			was := cronHash()
			setSecretData(secret, map[string]string{"dsn": testDSN + "&application_name=nudge_" + randomSuffix()})
			Eventually(cronHash, timeout, interval).ShouldNot(Equal(was))
		}

		setStreamMaxAge(stream, 72*time.Hour)
		nudge()
		Eventually(windowOf(name), timeout, interval).Should(Equal("73h"))
		Eventually(func() []string { return cronJob(name).Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args }, timeout, interval).Should(ContainElement("73h0m0s"))

		setStreamMaxAge(stream, 12*time.Hour)
		nudge()
		Eventually(func() string { return get(name).Status.Retention.PendingWindow }, timeout, interval).Should(Equal("13h"))
		Expect(get(name).Status.Retention.Window).To(Equal("73h"), "a shrink must wait for the old window")
		Expect(conditionMessage(name, messagingv1alpha1.ConditionRetentionResolved)).To(ContainSubstring("a smaller window 13h is adopted at"))

		clk.Step(72 * time.Hour)
		nudge()
		Expect(cronJob(name).Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args).To(ContainElement("73h0m0s"),
			"72h after the shrink was seen, the 73h window has not elapsed")
		Expect(get(name).Status.Retention.Window).To(Equal("73h"))

		clk.Step(2 * time.Hour)
		nudge()
		Eventually(func() string { return get(name).Status.Retention.Window }, timeout, interval).Should(Equal("13h"))
		Eventually(func() []string { return cronJob(name).Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args }, timeout, interval).Should(ContainElement("13h0m0s"))
	})

	It("keeps the last window, never a smaller one, while the broker is unreachable", func() {
		create(newConsumer(name, stream, secret))
		Eventually(windowOf(name), timeout, interval).Should(Equal("49h"))
		Eventually(condition(name, messagingv1alpha1.ConditionRetentionResolved), timeout, interval).Should(Equal("True/Broker"))

		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) {
			idc.Spec.Source.NATSJetStream.URL = "nats://127.0.0.1:1"
		})
		Eventually(condition(name, messagingv1alpha1.ConditionRetentionResolved), timeout, interval).Should(Equal("False/BrokerUnreachable"))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionRetentionResolved)).To(ContainSubstring("keeping the last window 49h"))
		Expect(get(name).Status.Retention.Window).To(Equal("49h"))
		Expect(*cronJob(name).Spec.Suspend).To(BeFalse(), "pruning goes on with the last known window")
		Expect(cronWindowArg(name)()).To(Equal("49h0m0s"))
	})

	It("stalls with UnboundedReplay and suspends pruning when the stream keeps messages forever", func() {
		unbounded := newStream(0)
		create(newConsumer(name, unbounded, secret))
		Eventually(condition(name, messagingv1alpha1.ConditionRetentionResolved), timeout, interval).Should(Equal("False/UnboundedReplay"))
		Expect(condition(name, messagingv1alpha1.ConditionStalled)()).To(Equal("True/UnboundedReplay"))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionRetentionResolved)).To(ContainSubstring("maxReplayAge"))
		Eventually(func() bool { return *cronJob(name).Spec.Suspend }, timeout, interval).Should(BeTrue())

		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Retention.MaxReplayAge = "720h" })
		Eventually(condition(name, messagingv1alpha1.ConditionRetentionResolved), timeout, interval).Should(HavePrefix("True/"))
		Eventually(func() bool { return *cronJob(name).Spec.Suspend }, timeout, interval).Should(BeFalse())
		Expect(get(name).Status.Retention.Window).To(Equal("721h"))
	})
})
