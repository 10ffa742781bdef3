package controllers

import (
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

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
		createOrdersTable(idc.Spec.Sink.Schema(), role)
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
