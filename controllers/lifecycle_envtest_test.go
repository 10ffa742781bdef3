package controllers

import (
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// The reconcile flow's bad days, on the real API server, PostgreSQL and NATS.
var _ = Describe("the reconcile flow", func() {
	var name, stream, secret string
	BeforeEach(func() {
		name = "flow-" + randomSuffix()
		stream = newStream(48 * time.Hour)
		secret = name + "-db"
		newSecret(secret, testDSN)
	})

	It("says BrokerLimits Unknown, not True, while the broker cannot be read", func() {
		idc := newConsumer(name, stream, secret)
		idc.Spec.Source.NATSJetStream.URL = "nats://127.0.0.1:1"
		create(idc)
		Eventually(condition(name, messagingv1alpha1.ConditionRetentionResolved), timeout, interval).Should(Equal("False/" + messagingv1alpha1.ReasonBrokerUnreachable))
		Expect(condition(name, messagingv1alpha1.ConditionBrokerLimits)()).To(Equal("Unknown/" + messagingv1alpha1.ReasonBrokerUnreachable))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionBrokerLimits)).To(ContainSubstring("not known"))

		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Source.NATSJetStream.URL = natsURL })
		Eventually(condition(name, messagingv1alpha1.ConditionBrokerLimits), timeout, interval).Should(Equal("True/" + messagingv1alpha1.ReasonLimitsFit))
	})

	It("deletes a resource whose spec no longer renders within 30s, leaving the tables with a Warning event", func() {
		idc := newConsumer(name, stream, secret)
		idc.Spec.Sink.Inbox.DeletionPolicy = messagingv1alpha1.DeletionPolicyDelete
		create(idc)
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		Expect(controllerutil.ContainsFinalizer(get(name), FinalizerDropInbox)).To(BeTrue())

		// The API server takes this spec; the runtime config does not (the
		// Redis entry field "body" holds the payload): a spec that an
		// upgrade made unrenderable looks the same.
		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) {
			idc.Spec.Emit = &messagingv1alpha1.EmitSpec{
				RedisStreams: &messagingv1alpha1.RedisStreamsEmit{Address: "127.0.0.1:6379", Stream: "flow-out"},
				Headers:      map[string]messagingv1alpha1.ValueExpression{"body": "$.orderId"},
			}
		})
		Eventually(condition(name, messagingv1alpha1.ConditionStalled), timeout, interval).Should(Equal("True/" + messagingv1alpha1.ReasonInvalidSpec))

		deleteAsked := time.Now()
		Expect(k8sClient.Delete(ctx, get(name))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &messagingv1alpha1.IdempotentConsumer{}))
		}, 30*time.Second, interval).Should(BeTrue(), "a deletion must never wait on a spec that does not render")
		GinkgoWriter.Printf("deleted %s after %s\n", name, time.Since(deleteAsked).Round(time.Millisecond))
		Eventually(eventsWithReason(name, messagingv1alpha1.ReasonInboxRetained), timeout, interval).Should(Equal(1))
		table := "inbox_" + strings.ReplaceAll(name, "-", "_")
		Expect(tableExists("projections", table)).To(BeTrue(), "the tables are left in place, nothing is lost")
		for _, t := range inbox.NamesFor(config.Sink{Schema: "projections", InboxTable: table}).Tables() {
			sinkExec("DROP TABLE IF EXISTS " + pgx.Identifier{"projections", t}.Sanitize())
		}
	})

	It("drops a deleted resource's database pool", func() {
		create(newConsumer(name, stream, secret))
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		owner := "default/" + name
		Expect(sinkClient.Pools().Holds(owner)).To(BeTrue())
		Expect(k8sClient.Delete(ctx, get(name))).To(Succeed())
		Eventually(func() bool { return sinkClient.Pools().Holds(owner) }, timeout, interval).Should(BeFalse())
	})

	It("creates the children with create-only applies: each is the controller's server-side apply alone", func() {
		create(newConsumer(name, stream, secret))
		Eventually(func() error { _, err := childManagers(&corev1.ConfigMap{}, name+"-runtime"); return err }, timeout, interval).Should(Succeed())
		Eventually(func() error { _, err := childManagers(&batchv1.CronJob{}, name+"-prune"); return err }, timeout, interval).Should(Succeed())
		for _, c := range []struct {
			obj  client.Object
			name string
		}{{&corev1.ConfigMap{}, name + "-runtime"}, {&appsv1.Deployment{}, name}, {&batchv1.CronJob{}, name + "-prune"}} {
			managers, err := childManagers(c.obj, c.name)
			Expect(err).NotTo(HaveOccurred())
			Expect(managers).To(Equal([]string{string(fieldOwner) + "/Apply"}), "%T %s: the managed fields a plain apply leaves", c.obj, c.name)
			Expect(c.obj.GetResourceVersion()).NotTo(Equal(createOnlyVersion))
			Expect(metav1.IsControlledBy(c.obj, get(name))).To(BeTrue())
		}
	})

	It("stops the pass on a child conflict: no redrive Job is created", func() {
		squatter := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name + "-runtime", Namespace: "default"}, Data: map[string]string{"mine": "yes"}}
		Expect(k8sClient.Create(ctx, squatter)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, squatter))).To(Succeed()) })
		idc := newConsumer(name, stream, secret)
		idc.Annotations = map[string]string{messagingv1alpha1.AnnotationRedrive: "flow-1"}
		create(idc)
		Eventually(condition(name, messagingv1alpha1.ConditionStalled), timeout, interval).Should(Equal("True/" + messagingv1alpha1.ReasonConflict))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionStalled)).To(ContainSubstring(name + "-runtime"))
		// The pass that set Stalled is the one that would have created it.
		var jobs batchv1.JobList
		Expect(k8sClient.List(ctx, &jobs, client.InNamespace("default"), client.MatchingLabels{"app.kubernetes.io/instance": name})).To(Succeed())
		Expect(jobs.Items).To(BeEmpty())
		Expect(get(name).Status.LastRedrive).To(BeNil())
		var cm corev1.ConfigMap
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(squatter), &cm)).To(Succeed())
		Expect(cm.Data).To(Equal(map[string]string{"mine": "yes"}), "another owner's ConfigMap is never overwritten")
	})
})

// childManagers reads a child into obj and lists its managed fields'
// managers as "manager/operation" (the status subresource's left out).
func childManagers(obj client.Object, name string) ([]string, error) {
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, obj); err != nil {
		return nil, err
	}
	var out []string
	for _, m := range obj.GetManagedFields() {
		if m.Subresource == "" {
			out = append(out, m.Manager+"/"+string(m.Operation))
		}
	}
	return out, nil
}
