package controllers

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

var _ = Describe("Id conflicts", func() {
	It("puts a non-zero count of id conflicts in the InboxReady message", func() {
		name := "conflicts-" + randomSuffix()
		stream := newStream(48 * time.Hour)
		secret := name + "-db"
		newSecret(secret, testDSN)
		idc := newConsumer(name, stream, secret)
		create(idc)
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		Expect(get(name).Spec.Message.ID.OnPayloadMismatch).To(Equal(messagingv1alpha1.PayloadMismatchPolicy("Record")), "the default")
		Expect(conditionMessage(name, messagingv1alpha1.ConditionInboxReady)).NotTo(ContainSubstring("id conflicts"))

		conn, err := pgx.Connect(ctx, testDSN)
		Expect(err).NotTo(HaveOccurred())
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, fmt.Sprintf(`INSERT INTO projections.%s_id_conflicts (message_id, claimed_fingerprint, conflict_fingerprint)
			VALUES ('e1', 1, 2), ('e2', 3, 4)`, idc.Spec.Sink.Inbox.Table))
		Expect(err).NotTo(HaveOccurred())
		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Delivery.MaxAttempts = 7 })
		Eventually(func() string { return conditionMessage(name, messagingv1alpha1.ConditionInboxReady) }, timeout, interval).
			Should(ContainSubstring("; 2 id conflicts: the producer reused message ids"))
		Expect(condition(name, messagingv1alpha1.ConditionInboxReady)()).To(Equal("True/Provisioned"))
	})
})
