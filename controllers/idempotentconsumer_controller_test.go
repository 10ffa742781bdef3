package controllers

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

const (
	timeout  = 60 * time.Second
	interval = 200 * time.Millisecond
)

// newStream creates a JetStream stream with the given MaxAge (0: unbounded).
func newStream(maxAge time.Duration) string {
	name := "CTRL_" + strings.ToUpper(randomSuffix())
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}, MaxAge: maxAge})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = js.DeleteStream(ctx, name) })
	return name
}

func setStreamMaxAge(name string, maxAge time.Duration) {
	s, err := js.Stream(ctx, name)
	Expect(err).NotTo(HaveOccurred())
	c := s.CachedInfo().Config
	c.MaxAge = maxAge
	_, err = js.UpdateStream(ctx, c)
	Expect(err).NotTo(HaveOccurred())
}

func newSecret(name, dsn string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, StringData: map[string]string{"dsn": dsn}}
	Expect(k8sClient.Create(ctx, s)).To(Succeed())
	DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, s))).To(Succeed()) })
	return s
}

func setSecretData(name string, data map[string]string) {
	var s corev1.Secret
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &s)).To(Succeed())
	s.StringData = data
	Expect(k8sClient.Update(ctx, &s)).To(Succeed())
}

// newConsumer is a JetStream -> PostgreSQL upsert resource, like the sample.
func newConsumer(name, stream, secret string) *messagingv1alpha1.IdempotentConsumer {
	return &messagingv1alpha1.IdempotentConsumer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: messagingv1alpha1.IdempotentConsumerSpec{
			Source: messagingv1alpha1.SourceSpec{NATSJetStream: &messagingv1alpha1.NATSJetStreamSource{
				URL: natsURL, Stream: stream, Consumer: name,
			}},
			Message: messagingv1alpha1.MessageSpec{
				ID: messagingv1alpha1.IDSpec{Header: "Nats-Msg-Id"},
				Entity: &messagingv1alpha1.EntitySpec{
					Key:      messagingv1alpha1.FieldSpec{JSONPath: "$.orderId"},
					Sequence: messagingv1alpha1.FieldSpec{JSONPath: "$.version"},
				},
			},
			Sink: messagingv1alpha1.SinkSpec{
				Postgres: messagingv1alpha1.PostgresSpec{ConnectionSecretRef: messagingv1alpha1.SecretKeyRef{Name: secret, Key: "dsn"}, Schema: "projections"},
				Inbox:    messagingv1alpha1.InboxSpec{Table: messagingv1alpha1.SQLIdentifier("inbox_" + strings.ReplaceAll(name, "-", "_"))},
				Effect: messagingv1alpha1.EffectSpec{Upsert: &messagingv1alpha1.UpsertEffect{
					Table: "orders", Key: []messagingv1alpha1.SQLIdentifier{"order_id"},
					Columns: messagingv1alpha1.Columns{"order_id": "$.orderId", "status": "$.status", "version": "$.version"},
				}},
			},
			Runtime: messagingv1alpha1.RuntimeSpec{
				Replicas:  ptr.To(int32(2)),
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}},
			},
		},
	}
}

func create(idc *messagingv1alpha1.IdempotentConsumer) {
	Expect(k8sClient.Create(ctx, idc)).To(Succeed())
	DeferCleanup(func() {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, idc))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(idc), &messagingv1alpha1.IdempotentConsumer{}))
		}, timeout, interval).Should(BeTrue())
	})
}

func get(name string) *messagingv1alpha1.IdempotentConsumer {
	var idc messagingv1alpha1.IdempotentConsumer
	ExpectWithOffset(1, k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &idc)).To(Succeed())
	return &idc
}

func update(name string, mutate func(*messagingv1alpha1.IdempotentConsumer)) {
	Eventually(func() error {
		idc := get(name)
		mutate(idc)
		return k8sClient.Update(ctx, idc)
	}, timeout, interval).Should(Succeed())
}

// condition returns "Status/Reason" of a condition, for compact assertions.
func condition(name, typ string) func() string {
	return func() string {
		c := meta.FindStatusCondition(get(name).Status.Conditions, typ)
		if c == nil {
			return ""
		}
		return string(c.Status) + "/" + c.Reason
	}
}

func conditionMessage(name, typ string) string {
	c := meta.FindStatusCondition(get(name).Status.Conditions, typ)
	if c == nil {
		return ""
	}
	return c.Message
}

func windowOf(name string) func() string {
	return func() string {
		if r := get(name).Status.Retention; r != nil {
			return r.Window
		}
		return ""
	}
}

func deployment(name string) *appsv1.Deployment {
	var d appsv1.Deployment
	ExpectWithOffset(1, k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &d)).To(Succeed())
	return &d
}

// podAnnotation reads a pod-template annotation, "" while the Deployment is
// not there yet (for Eventually).
func podAnnotation(name, key string) func() string {
	return func() string {
		var d appsv1.Deployment
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &d); err != nil {
			return ""
		}
		return d.Spec.Template.Annotations[key]
	}
}

func cronJob(name string) *batchv1.CronJob {
	var c batchv1.CronJob
	ExpectWithOffset(1, k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-prune"}, &c)).To(Succeed())
	return &c
}

// markAvailable plays the Deployment controller: the Deployment reports its
// replicas ready and Available.
func markAvailable(name string) {
	Eventually(func() error {
		d := &appsv1.Deployment{}
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, d); err != nil {
			return err
		}
		n := ptr.Deref(d.Spec.Replicas, 1)
		d.Status = appsv1.DeploymentStatus{
			ObservedGeneration: d.Generation, Replicas: n, ReadyReplicas: n, AvailableReplicas: n, UpdatedReplicas: n,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable", Message: "ok",
				LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		}
		return k8sClient.Status().Update(ctx, d)
	}, timeout, interval).Should(Succeed())
}

func tableExists(schema, table string) bool {
	conn, err := pgx.Connect(ctx, testDSN)
	Expect(err).NotTo(HaveOccurred())
	defer conn.Close(ctx)
	var ok bool
	Expect(conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, table}.Sanitize()).Scan(&ok)).To(Succeed())
	return ok
}

func configMapVersion(name string) string {
	var cm corev1.ConfigMap
	ExpectWithOffset(1, k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-runtime"}, &cm)).To(Succeed())
	return cm.ResourceVersion
}

func reconcileTotal() float64 {
	families, err := ctrlmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelValue(m, "controller") == "idempotentconsumer" {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func envByName(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// tableRow reads the resource through the API server's Table output (what
// kubectl get prints) and returns its cells by column name.
func tableRow(name string) map[string]any {
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	raw, err := cs.RESTClient().Get().
		AbsPath("/apis/messaging.idempotency.dev/v1alpha1/namespaces/default/idempotentconsumers", name).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Raw()
	Expect(err).NotTo(HaveOccurred())
	var table metav1.Table
	Expect(json.Unmarshal(raw, &table)).To(Succeed())
	Expect(table.Rows).To(HaveLen(1))
	out := map[string]any{}
	for i, c := range table.ColumnDefinitions {
		out[c.Name] = table.Rows[0].Cells[i]
	}
	return out
}

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

var _ = Describe("failures", func() {
	var name, stream string

	BeforeEach(func() {
		name = "fail-" + randomSuffix()
		stream = newStream(24 * time.Hour)
	})

	recoverToReady := func() {
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		// Marked available only once the preflight let the replicas up.
		Eventually(condition(name, messagingv1alpha1.ConditionEffectReady), timeout, interval).Should(Equal("True/Ready"))
		markAvailable(name)
		Eventually(condition(name, messagingv1alpha1.ConditionReady), timeout, interval).Should(Equal("True/Ready"))
	}

	It("reports a missing Secret and recovers when it appears", func() {
		create(newConsumer(name, stream, name+"-db"))
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("False/SecretNotFound"))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionReady)).To(ContainSubstring(fmt.Sprintf("Secret %q", name+"-db")))
		Expect(condition(name, messagingv1alpha1.ConditionReconciling)()).To(HavePrefix("True/"))
		newSecret(name+"-db", testDSN)
		recoverToReady()
	})

	It("reports a Secret without the key", func() {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-db", Namespace: "default"}, StringData: map[string]string{"url": testDSN}}
		Expect(k8sClient.Create(ctx, s)).To(Succeed())
		DeferCleanup(func() { Expect(k8sClient.Delete(ctx, s)).To(Succeed()) })
		create(newConsumer(name, stream, name+"-db"))
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("False/SecretKeyMissing"))
		setSecretData(name+"-db", map[string]string{"dsn": testDSN})
		recoverToReady()
	})

	It("reports a DSN that does not parse, without echoing it, and recovers when fixed", func() {
		newSecret(name+"-db", "postgres://postgres:s3cret@[::1:5432/db")
		create(newConsumer(name, stream, name+"-db"))
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("False/InvalidDSN"))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionInboxReady)).NotTo(ContainSubstring("s3cret"))
		setSecretData(name+"-db", map[string]string{"dsn": testDSN})
		recoverToReady()
	})

	It("reports an unreachable database and recovers when it is reachable", func() {
		newSecret(name+"-db", "postgres://postgres:s3cret@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=2")
		create(newConsumer(name, stream, name+"-db"))
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("False/DatabaseUnreachable"))
		msg := conditionMessage(name, messagingv1alpha1.ConditionInboxReady)
		Expect(msg).To(ContainSubstring("cannot reach"))
		Expect(msg).NotTo(ContainSubstring("s3cret"))
		// Transient: re-checked while Reconciling, never Stalled.
		Expect(condition(name, messagingv1alpha1.ConditionStalled)()).To(Equal("False/Ready"))
		Expect(condition(name, messagingv1alpha1.ConditionReconciling)()).To(Equal("True/DatabaseUnreachable"))
		setSecretData(name+"-db", map[string]string{"dsn": testDSN})
		recoverToReady()
	})

	It("reports permission denied and recovers once the role is granted", func() {
		role := "idc_noperm_" + randomSuffix()
		conn, err := pgx.Connect(ctx, testDSN)
		Expect(err).NotTo(HaveOccurred())
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			_, _ = conn.Exec(ctx, "REASSIGN OWNED BY "+role+" TO postgres")
			_, _ = conn.Exec(ctx, "DROP OWNED BY "+role)
			_, _ = conn.Exec(ctx, "DROP ROLE "+role)
		})
		newSecret(name+"-db", fmt.Sprintf("postgres://%s@127.0.0.1:5432/%s?sslmode=disable", role, testDB))
		idc := newConsumer(name, stream, name+"-db")
		idc.Spec.Sink.Postgres.Schema = messagingv1alpha1.SQLIdentifier("s_" + role)
		create(idc)
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("False/PermissionDenied"))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionInboxReady)).To(ContainSubstring("grant"))
		Eventually(condition(name, messagingv1alpha1.ConditionStalled), timeout, interval).Should(Equal("True/PermissionDenied"))
		// The schema does not exist and the role may not create it: the
		// message names that one grant, and no other.
		Expect(conditionMessage(name, messagingv1alpha1.ConditionStalled)).To(ContainSubstring("GRANT CREATE ON DATABASE"))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionStalled)).NotTo(ContainSubstring("ON SCHEMA"))

		// Ten failed passes later the re-check period still holds: each
		// pass comes about recheckPeriod after the last, where
		// controller-runtime's per-item backoff would by now wait 5s
		// (5ms x 2^10) and keep doubling.
		owner := "default/" + name
		Eventually(func() int { return len(ensures.of(owner)) }, 20*recheckPeriod, interval).Should(BeNumerically(">=", 13))
		at := ensures.of(owner)
		gaps := make([]string, 0, len(at))
		for i := 1; i < len(at); i++ {
			gaps = append(gaps, at[i].Sub(at[i-1]).Round(10*time.Millisecond).String())
		}
		GinkgoWriter.Printf("passes of a resource whose inbox cannot be provisioned came %s apart (re-check period %s)\n", strings.Join(gaps, " "), recheckPeriod)
		// The upper bound leaves room for a slow pass on a busy machine and
		// still refuses a backoff, which is past 5s by the 11th failure.
		for i := 10; i < len(at); i++ {
			gap := at[i].Sub(at[i-1])
			Expect(gap).To(And(BeNumerically(">=", recheckPeriod*8/10), BeNumerically("<=", recheckPeriod*3/2+time.Second)),
				"pass %d came %s after the one before; want the re-check period %s", i+1, gap, recheckPeriod)
		}

		// The GRANT changes nothing Kubernetes sees: only the re-check
		// notices it, within one period.
		_, err = conn.Exec(ctx, "GRANT CREATE ON DATABASE "+pgx.Identifier{testDB}.Sanitize()+" TO "+role)
		Expect(err).NotTo(HaveOccurred())
		granted := time.Now()
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), recheckPeriod+2*time.Second, 50*time.Millisecond).Should(Equal("True/Provisioned"))
		GinkgoWriter.Printf("the GRANT was noticed after %s (re-check period %s)\n", time.Since(granted).Round(time.Millisecond), recheckPeriod)
		Expect(condition(name, messagingv1alpha1.ConditionStalled)()).NotTo(Equal("True/PermissionDenied"))
		createOrdersTable(string(idc.Spec.Sink.Postgres.Schema), role)
		recoverToReady()
	})

	It("stalls the newer of two resources claiming the same inbox table with reason Conflict", func() {
		newSecret(name+"-db", testDSN)
		first := newConsumer(name, stream, name+"-db")
		create(first)
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))

		second := newConsumer(name+"-b", stream, name+"-db")
		second.Spec.Sink.Inbox.Table = first.Spec.Sink.Inbox.Table
		second.Spec.Sink.Inbox.DeletionPolicy = messagingv1alpha1.DeletionPolicyDelete
		create(second)
		Eventually(condition(name+"-b", messagingv1alpha1.ConditionStalled), timeout, interval).Should(Equal("True/Conflict"))
		Expect(conditionMessage(name+"-b", messagingv1alpha1.ConditionStalled)).To(ContainSubstring(name))
		Expect(condition(name+"-b", messagingv1alpha1.ConditionReady)()).To(Equal("False/Conflict"))
		Expect(condition(name, messagingv1alpha1.ConditionStalled)()).To(Equal("False/Ready"))

		By("deleting the loser, which must not drop the winner's tables")
		Expect(k8sClient.Delete(ctx, second)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(second), &messagingv1alpha1.IdempotentConsumer{}))
		}, timeout, interval).Should(BeTrue())
		Expect(tableExists("projections", string(first.Spec.Sink.Inbox.Table))).To(BeTrue())
	})

	It("lets the loser of a conflict take over the inbox a deleted winner left only when a person names it", func() {
		newSecret(name+"-db", testDSN)
		first := newConsumer(name, stream, name+"-db")
		create(first)
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		second := newConsumer(name+"-b", stream, name+"-db")
		second.Spec.Sink.Inbox.Table = first.Spec.Sink.Inbox.Table
		create(second)
		Eventually(condition(name+"-b", messagingv1alpha1.ConditionStalled), timeout, interval).Should(Equal("True/Conflict"))

		Expect(k8sClient.Delete(ctx, first)).To(Succeed()) // deletionPolicy Retain: the tables stay, recording their owner
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(first), &messagingv1alpha1.IdempotentConsumer{}))
		}, timeout, interval).Should(BeTrue())
		// The deletion wakes the loser, which still finds the inbox
		// recorded for the first: a name is never enough to take it over.
		Consistently(condition(name+"-b", messagingv1alpha1.ConditionStalled), 2*time.Second, interval).Should(Equal("True/Conflict"))
		var ks corev1.Namespace
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "kube-system"}, &ks)).To(Succeed())
		ref := string(ks.UID) + "/default/" + name
		Expect(conditionMessage(name+"-b", messagingv1alpha1.ConditionStalled)).To(ContainSubstring(messagingv1alpha1.AnnotationAdoptInboxFrom + "=" + ref))
		update(name+"-b", func(idc *messagingv1alpha1.IdempotentConsumer) {
			idc.Annotations = map[string]string{messagingv1alpha1.AnnotationAdoptInboxFrom: ref}
		})
		// Well inside the 5m re-derivation period: the annotation wakes it.
		Eventually(condition(name+"-b", messagingv1alpha1.ConditionStalled), 20*time.Second, interval).Should(Equal("False/Ready"))
		Expect(condition(name+"-b", messagingv1alpha1.ConditionInboxReady)()).To(Equal("True/Provisioned"))
		Eventually(eventsWithReason(name+"-b", messagingv1alpha1.ReasonInboxAdopted), timeout, interval).Should(Equal(1))
	})

	It("stalls with Conflict when two resources share a JetStream consumer", func() {
		newSecret(name+"-db", testDSN)
		create(newConsumer(name, stream, name+"-db"))
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		second := newConsumer(name+"-b", stream, name+"-db")
		second.Spec.Source.NATSJetStream.Consumer = name
		create(second)
		Eventually(condition(name+"-b", messagingv1alpha1.ConditionStalled), timeout, interval).Should(Equal("True/Conflict"))
	})
})

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
