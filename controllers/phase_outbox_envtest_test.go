package controllers

import (
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

var _ = Describe("a consumer with spec.emit", func() {
	It("provisions the outbox, passes the emit credentials as Secret refs and reports status.outbox", func() {
		name := "emit-" + randomSuffix()
		stream := newStream(48 * time.Hour)
		secret := name + "-db"
		newSecret(secret, testDSN)
		idc := newConsumer(name, stream, secret)
		idc.Spec.Emit = &messagingv1alpha1.EmitSpec{NATSJetStream: &messagingv1alpha1.NATSJetStreamEmit{
			URL: natsURL, Subject: "order-projected",
			CredentialsSecretRef: &messagingv1alpha1.SecretKeyRef{Name: secret, Key: "dsn"},
		}}
		create(idc)
		table := "inbox_" + strings.ReplaceAll(name, "-", "_")

		Eventually(func() *messagingv1alpha1.OutboxStatus { return get(name).Status.Outbox }, timeout, interval).
			Should(Equal(&messagingv1alpha1.OutboxStatus{Pending: 0, OldestAge: metav1.Duration{}}))
		Expect(tableExists("projections", table+"_outbox")).To(BeTrue())
		c := deployment(name).Spec.Template.Spec.Containers[0]
		env := envByName(c, envEmitNATSCreds)
		Expect(env).NotTo(BeNil())
		Expect(env.Value).To(BeEmpty())
		Expect(env.ValueFrom.SecretKeyRef.Name).To(Equal(secret))

		conn, err := pgx.Connect(ctx, testDSN)
		Expect(err).NotTo(HaveOccurred())
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `INSERT INTO `+pgx.Identifier{"projections", table + "_outbox"}.Sanitize()+
			` (event_id, source_id, shard, payload, created_at) VALUES ('e1', 'm1', 0, '{}', now() - interval '1 minute')`)
		Expect(err).NotTo(HaveOccurred())
		// A spec change wakes the controller; the next pass reads the backlog.
		update(name, func(o *messagingv1alpha1.IdempotentConsumer) { o.Spec.Delivery.BatchSize = 400 })
		Eventually(func() int64 {
			if o := get(name).Status.Outbox; o != nil {
				return o.Pending
			}
			return -1
		}, timeout, interval).Should(Equal(int64(1)))
		Expect(get(name).Status.Outbox.OldestAge.Duration).To(BeNumerically(">=", time.Minute))
	})
})
