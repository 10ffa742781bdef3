package controllers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// The shrink protection lives in the inbox database: a resource deleted and
// applied again (Argo CD replace, a restore without status) finds it there.
var _ = Describe("a re-created resource", func() {
	var name, stream, secret string

	BeforeEach(func() {
		name = "recreate-" + randomSuffix()
		stream = newStream(48 * time.Hour)
		secret = name + "-db"
		newSecret(secret, testDSN)
	})

	explicit := func(window string, policy messagingv1alpha1.DeletionPolicy) *messagingv1alpha1.IdempotentConsumer {
		idc := newConsumer(name, stream, secret)
		idc.Spec.Retention.Mode = messagingv1alpha1.RetentionModeExplicit
		idc.Spec.Retention.Window = messagingv1alpha1.Duration(window)
		idc.Spec.Sink.Inbox.DeletionPolicy = policy
		return idc
	}
	retentionOf := func() *messagingv1alpha1.RetentionStatus {
		if r := get(name).Status.Retention; r != nil {
			return r
		}
		return &messagingv1alpha1.RetentionStatus{}
	}
	// collectGarbage plays the garbage collector envtest lacks: the
	// children of the deleted resource go, as they would in a cluster, so
	// the re-created one renders its own.
	collectGarbage := func() {
		key := func(n string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: "default", Name: n} }
		for _, obj := range []client.Object{
			&corev1.ConfigMap{ObjectMeta: key(name + "-runtime")},
			&appsv1.Deployment{ObjectMeta: key(name)},
			&batchv1.CronJob{ObjectMeta: key(name + "-prune")},
		} {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)))).To(Succeed())
		}
	}
	pendingSince := func() *metav1.Time { return retentionOf().PendingSince }
	// shrinkThenDelete takes the window from 24h to 1h, checks the shrink
	// waits, deletes the resource and waits until it is gone.
	shrinkThenDelete := func(policy messagingv1alpha1.DeletionPolicy) *metav1.Time {
		idc := explicit("24h", policy)
		create(idc)
		Eventually(windowOf(name), timeout, interval).Should(Equal("24h"))
		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Retention.Window = "1h" })
		Eventually(func() string { return retentionOf().PendingWindow }, timeout, interval).Should(Equal("1h"))
		Expect(retentionOf().Window).To(Equal("24h"), "a shrink must wait for the old window")
		since := pendingSince()
		Expect(since).NotTo(BeNil())

		Expect(k8sClient.Delete(ctx, idc)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(idc), &messagingv1alpha1.IdempotentConsumer{}))
		}, timeout, interval).Should(BeTrue())
		collectGarbage()
		return since
	}

	It("keeps the stored window (deletionPolicy Retain) until the old window has elapsed", func() {
		since := shrinkThenDelete(messagingv1alpha1.DeletionPolicyRetain)

		// Applied again with the small window and no status at all.
		create(explicit("1h", messagingv1alpha1.DeletionPolicyRetain))
		Eventually(func() string { return retentionOf().PendingWindow }, timeout, interval).Should(Equal("1h"))
		Expect(retentionOf().Window).To(Equal("24h"), "the re-created resource must not adopt the smaller window early")
		Expect(pendingSince().Time.Equal(since.Time)).To(BeTrue(), "pendingSince %s, want the original %s", pendingSince(), since)
		Eventually(cronWindowArg(name), timeout, interval).Should(Equal("24h0m0s"))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionRetentionResolved)).To(ContainSubstring("a smaller window 1h is adopted at"))

		// The Secret watch makes the controller look again at the new time.
		clk.Step(24*time.Hour + time.Minute)
		setSecretData(secret, map[string]string{"dsn": testDSN, "nudge": randomSuffix()})
		Eventually(windowOf(name), timeout, interval).Should(Equal("1h"))
		Expect(retentionOf().PendingWindow).To(BeEmpty())
		Expect(retentionOf().PendingSince).To(BeNil())
		Eventually(cronWindowArg(name), timeout, interval).Should(Equal("1h0m0s"))
	})

	It("starts fresh with deletionPolicy Delete", func() {
		shrinkThenDelete(messagingv1alpha1.DeletionPolicyDelete)

		create(explicit("1h", messagingv1alpha1.DeletionPolicyDelete))
		Eventually(windowOf(name), timeout, interval).Should(Equal("1h"))
		Expect(retentionOf().PendingWindow).To(BeEmpty())
		Expect(retentionOf().PendingSince).To(BeNil())
	})
})
