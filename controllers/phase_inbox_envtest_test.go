package controllers

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// An inbox is known by the database object, not by a Kubernetes name: its
// meta row records its owner and epoch (issue "evidence, not inference"),
// on the real API server and PostgreSQL.
var _ = Describe("the inbox's owner and epoch", func() {
	var name, stream, secret, table string
	BeforeEach(func() {
		name = "owner-" + randomSuffix()
		stream = newStream(48 * time.Hour)
		secret = name + "-db"
		newSecret(secret, testDSN)
		table = "inbox_" + name[len("owner-"):]
	})
	inboxRows := func() int {
		conn, err := pgx.Connect(ctx, testDSN)
		Expect(err).NotTo(HaveOccurred())
		defer conn.Close(ctx)
		var n int
		Expect(conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{"projections", table}.Sanitize()).Scan(&n)).To(Succeed())
		return n
	}
	owned := func(idc *messagingv1alpha1.IdempotentConsumer) *messagingv1alpha1.IdempotentConsumer {
		idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier(table)
		return idc
	}
	epochOf := func(ns, n string) func() string {
		return func() string {
			var idc messagingv1alpha1.IdempotentConsumer
			if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: n}, &idc); err != nil || idc.Status.Inbox == nil {
				return ""
			}
			return idc.Status.Inbox.Epoch
		}
	}

	It("refuses a second resource in another namespace, through another Secret, on the same table, and its deletion drops nothing", func() {
		create(owned(newConsumer(name, stream, secret)))
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/" + messagingv1alpha1.ReasonProvisioned))
		Expect(get(name).Status.Inbox.Database).To(MatchRegexp(`^[0-9]+/`))
		sinkExec(fmt.Sprintf("INSERT INTO projections.%s (message_id) SELECT 'm-' || g FROM generate_series(1, 200) g", table))

		tenant := "tenant-" + randomSuffix()
		Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}})).To(Succeed())
		other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "their-db", Namespace: tenant}, StringData: map[string]string{"url": testDSN}}
		Expect(k8sClient.Create(ctx, other)).To(Succeed())
		rival := owned(newConsumer(name, stream, "their-db"))
		rival.Namespace = tenant
		rival.Spec.Source.NATSJetStream.Consumer = name + "-b"
		rival.Spec.Sink.Postgres.ConnectionSecretRef.Key = "url"
		rival.Spec.Sink.Inbox.DeletionPolicy = messagingv1alpha1.DeletionPolicyDelete
		Expect(k8sClient.Create(ctx, rival)).To(Succeed())

		stalled := func() string {
			var idc messagingv1alpha1.IdempotentConsumer
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(rival), &idc)).To(Succeed())
			if c := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionStalled); c != nil && c.Status == metav1.ConditionTrue {
				return c.Reason + ": " + c.Message
			}
			return ""
		}
		Eventually(stalled, timeout, interval).Should(HavePrefix(messagingv1alpha1.ReasonConflict + ": "))
		msg := stalled()
		GinkgoWriter.Printf("the second resource: %s\n", msg)
		Expect(msg).To(ContainSubstring("default/" + name))
		Expect(msg).To(ContainSubstring(messagingv1alpha1.AnnotationAdoptInboxFrom + "="))
		Expect(inboxRows()).To(Equal(200), "the refused resource claimed nothing")

		Expect(k8sClient.Delete(ctx, rival)).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(rival), &messagingv1alpha1.IdempotentConsumer{}))
		}, timeout, interval).Should(BeTrue())
		Expect(tableExists("projections", table)).To(BeTrue(), "deleting the refused resource (deletionPolicy Delete) dropped the owner's inbox")
		Expect(inboxRows()).To(Equal(200), "the owner keeps every claim")
		Expect(eventsIn(tenant, rival.Name, messagingv1alpha1.ReasonInboxRetained)()).To(Equal(1))
		Expect(eventsWithReason(name, "InboxDropped")()).To(Equal(0), "no drop is reported on the owner")
		Expect(condition(name, messagingv1alpha1.ConditionInboxReady)()).To(Equal("True/" + messagingv1alpha1.ReasonProvisioned))
	})

	It("adopts the inbox of a resource re-created under its name without status (a restore, an Argo CD replace)", func() {
		create(owned(newConsumer(name, stream, secret)))
		Eventually(epochOf("default", name), timeout, interval).ShouldNot(BeEmpty())
		epoch, uid := epochOf("default", name)(), get(name).UID
		sinkExec(fmt.Sprintf("INSERT INTO projections.%s (message_id) VALUES ('m-1'), ('m-2')", table))

		Expect(k8sClient.Delete(ctx, get(name))).To(Succeed()) // deletionPolicy Retain
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &messagingv1alpha1.IdempotentConsumer{}))
		}, timeout, interval).Should(BeTrue())
		create(owned(newConsumer(name, stream, secret)))
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/" + messagingv1alpha1.ReasonProvisioned))
		Expect(get(name).UID).NotTo(Equal(uid))
		Expect(epochOf("default", name)()).To(Equal(epoch), "the restored resource continues the inbox's epoch")
		Expect(inboxRows()).To(Equal(2))
		Eventually(eventsWithReason(name, messagingv1alpha1.ReasonInboxAdopted), timeout, interval).Should(Equal(1))
	})

	It("fails closed on an inbox dropped behind its back, and starts empty only when a person accepts", func() {
		create(owned(newConsumer(name, stream, secret)))
		Eventually(epochOf("default", name), timeout, interval).ShouldNot(BeEmpty())
		epoch := epochOf("default", name)()
		Eventually(runtimeEpoch(name), timeout, interval).Should(Equal(epoch))

		sinkExec(fmt.Sprintf("DROP TABLE projections.%s, projections.%s_meta", table, table))
		// A spec change is a pass; the periodic one would come within
		// --retention-period, and a running runtime's readiness sooner.
		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Delivery.BatchSize = 400 })
		Eventually(condition(name, messagingv1alpha1.ConditionStalled), timeout, interval).Should(Equal("True/" + messagingv1alpha1.ReasonInboxLost))
		msg := conditionMessage(name, messagingv1alpha1.ConditionStalled)
		GinkgoWriter.Printf("InboxLost: %s\n", msg)
		Expect(msg).To(ContainSubstring("do not exist"))
		Expect(msg).To(ContainSubstring(fmt.Sprintf("kubectl annotate idc %s %s=%s", name, messagingv1alpha1.AnnotationAcceptInboxLoss, epoch)))
		Expect(condition(name, messagingv1alpha1.ConditionInboxReady)()).To(Equal("False/" + messagingv1alpha1.ReasonInboxLost))
		Expect(condition(name, messagingv1alpha1.ConditionReady)()).To(HavePrefix("False/"))
		Expect(tableExists("projections", table)).To(BeFalse(), "a lost inbox is never re-created silently")
		Expect(testutil.ToFloat64(inboxLost.WithLabelValues("default", name))).To(Equal(1.0))
		Expect(runtimeEpoch(name)()).To(Equal(epoch), "the runtime keeps the lost epoch, so it holds")

		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) {
			idc.Annotations = map[string]string{messagingv1alpha1.AnnotationAcceptInboxLoss: epoch}
		})
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/" + messagingv1alpha1.ReasonProvisioned))
		next := epochOf("default", name)()
		Expect(next).NotTo(BeEmpty())
		Expect(next).NotTo(Equal(epoch))
		Expect(tableExists("projections", table)).To(BeTrue())
		Expect(inboxRows()).To(Equal(0))
		Eventually(runtimeEpoch(name), timeout, interval).Should(Equal(next), "the pods roll onto the new epoch")
		Expect(testutil.ToFloat64(inboxLost.WithLabelValues("default", name))).To(Equal(0.0))
		Eventually(eventsWithReason(name, messagingv1alpha1.ReasonInboxLossAccepted), timeout, interval).Should(Equal(1))
		Expect(condition(name, messagingv1alpha1.ConditionStalled)()).NotTo(Equal("True/" + messagingv1alpha1.ReasonInboxLost))
	})

	It("fails closed on an inbox restored from a backup older than its last recorded prune run", func() {
		create(owned(newConsumer(name, stream, secret)))
		Eventually(epochOf("default", name), timeout, interval).ShouldNot(BeEmpty())
		epoch := epochOf("default", name)()
		runs := fmt.Sprintf("projections.%s_prune_runs", table)
		sinkExec(fmt.Sprintf("INSERT INTO %s (started_at, finished_at, cutoff, window_seconds) VALUES (now() - interval '1 minute', now(), now() - interval '25 hours', 90000)", runs))
		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Delivery.BatchSize = 400 })
		Eventually(func() bool { return get(name).Status.LastPrune != nil }, timeout, interval).Should(BeTrue())

		// The database restored from a backup taken an hour earlier: its
		// last prune run is older than the one status recorded.
		sinkExec("DELETE FROM "+runs,
			fmt.Sprintf("INSERT INTO %s (started_at, finished_at, cutoff, window_seconds) VALUES (now() - interval '61 minutes', now() - interval '1 hour', now() - interval '26 hours', 90000)", runs))
		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Delivery.BatchSize = 300 })
		Eventually(condition(name, messagingv1alpha1.ConditionStalled), timeout, interval).Should(Equal("True/" + messagingv1alpha1.ReasonInboxLost))
		msg := conditionMessage(name, messagingv1alpha1.ConditionStalled)
		GinkgoWriter.Printf("restored: %s\n", msg)
		Expect(msg).To(ContainSubstring("older than this resource's record"))
		Expect(msg).To(ContainSubstring(messagingv1alpha1.AnnotationAcceptInboxLoss + "=" + epoch))
	})
})

// runtimeEpoch reads the inbox epoch the consumer's ConfigMap gives the
// runtime.
func runtimeEpoch(name string) func() string {
	return func() string {
		var cm corev1.ConfigMap
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-runtime"}, &cm); err != nil {
			return ""
		}
		var cfg config.Config
		if err := json.Unmarshal([]byte(cm.Data[specs.ConfigKey]), &cfg); err != nil {
			return ""
		}
		return cfg.Sink.InboxEpoch
	}
}

// eventsIn counts the events about a resource in a namespace with one
// reason.
func eventsIn(namespace, name, reason string) func() int {
	return func() int {
		var list eventsv1.EventList
		Expect(k8sClient.List(ctx, &list, client.InNamespace(namespace))).To(Succeed())
		n := 0
		for _, e := range list.Items {
			if e.Regarding.Kind == "IdempotentConsumer" && e.Regarding.Name == name && e.Reason == reason {
				n++
			}
		}
		return n
	}
}
