package controllers

import (
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// sinkExec runs statements on the suite's database as postgres.
func sinkExec(stmts ...string) {
	conn, err := pgx.Connect(ctx, testDSN)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	defer conn.Close(ctx)
	for _, s := range stmts {
		_, err := conn.Exec(ctx, s)
		ExpectWithOffset(1, err).NotTo(HaveOccurred(), s)
	}
}

// eventsWithReason counts the events about a resource with one reason.
func eventsWithReason(name, reason string) func() int {
	return func() int {
		var list eventsv1.EventList
		Expect(k8sClient.List(ctx, &list, client.InNamespace("default"))).To(Succeed())
		n := 0
		for _, e := range list.Items {
			if e.Regarding.Kind == "IdempotentConsumer" && e.Regarding.Name == name && e.Reason == reason {
				n++
			}
		}
		return n
	}
}

func replicasOf(name string) func() int32 {
	return func() int32 {
		d := deployment(name)
		return ptr.Deref(d.Spec.Replicas, -1)
	}
}

// holdsThenRecovers: EffectReady False with reason (an event), the
// Deployment at 0 replicas and Ready False; after fix, EffectReady True
// (an event), the declared replicas and Ready, with no manual step.
func holdsThenRecovers(name, reason string, mustName []string, fix func()) {
	Eventually(condition(name, messagingv1alpha1.ConditionEffectReady), timeout, interval).Should(Equal("False/" + reason))
	msg := conditionMessage(name, messagingv1alpha1.ConditionEffectReady)
	for _, s := range mustName {
		Expect(msg).To(ContainSubstring(s))
	}
	Eventually(replicasOf(name), timeout, interval).Should(Equal(int32(0)))
	Expect(condition(name, messagingv1alpha1.ConditionReady)()).To(Equal("False/" + reason))
	// Only a person can fix it: Stalled (kstatus Failed, Argo CD
	// Degraded) says what to run, and Reconciling is False.
	Expect(condition(name, messagingv1alpha1.ConditionStalled)()).To(Equal("True/" + reason))
	Expect(conditionMessage(name, messagingv1alpha1.ConditionStalled)).To(Equal(msg))
	Expect(condition(name, messagingv1alpha1.ConditionReconciling)()).To(Equal("False/Ready"))
	Expect(condition(name, messagingv1alpha1.ConditionRuntimeReady)()).To(Equal("False/" + messagingv1alpha1.ReasonWaitingForEffect))
	Eventually(eventsWithReason(name, reason), timeout, interval).Should(Equal(1))

	fix()
	Eventually(condition(name, messagingv1alpha1.ConditionEffectReady), timeout, interval).Should(Equal("True/Ready"),
		func() string { return conditionMessage(name, messagingv1alpha1.ConditionEffectReady) })
	Eventually(replicasOf(name), timeout, interval).Should(Equal(int32(2)))
	markAvailable(name)
	Eventually(condition(name, messagingv1alpha1.ConditionReady), timeout, interval).Should(Equal("True/Ready"))
	Expect(condition(name, messagingv1alpha1.ConditionStalled)()).To(Equal("False/Ready"))
	Eventually(eventsWithReason(name, "EffectReady"), timeout, interval).Should(Equal(1))
	// Several re-checks ran while it was False; still one event each way.
	Expect(eventsWithReason(name, reason)()).To(Equal(1))
}

var _ = Describe("the EffectReady preflight", func() {
	var name, stream, schema string

	BeforeEach(func() {
		name = "effect-" + randomSuffix()
		stream = newStream(24 * time.Hour)
		schema = "fx_" + randomSuffix()
		newSecret(name+"-db", testDSN)
	})

	consumer := func() *messagingv1alpha1.IdempotentConsumer {
		idc := newConsumer(name, stream, name+"-db")
		idc.Spec.Sink.Postgres.Schema = messagingv1alpha1.SQLIdentifier(schema)
		return idc
	}
	orders := func() string { return pgx.Identifier{schema, "orders"}.Sanitize() }

	It("TableNotFound until the table is created", func() {
		create(consumer())
		holdsThenRecovers(name, messagingv1alpha1.ReasonTableNotFound, []string{schema + `"."orders"`, "CREATE TABLE"}, func() {
			createOrdersTable(schema, "")
		})
	})

	It("ColumnNotFound until the column is added", func() {
		sinkExec("CREATE SCHEMA "+schema, "CREATE TABLE "+orders()+" (order_id text PRIMARY KEY, version bigint)")
		create(consumer())
		holdsThenRecovers(name, messagingv1alpha1.ReasonColumnNotFound, []string{`"status"`, "ADD COLUMN"}, func() {
			sinkExec("ALTER TABLE " + orders() + " ADD COLUMN status text")
		})
	})

	It("ColumnTypeMismatch until the sequence column is an integer", func() {
		sinkExec("CREATE SCHEMA "+schema, "CREATE TABLE "+orders()+" (order_id text PRIMARY KEY, status text, version text)")
		idc := consumer()
		idc.Spec.Sink.Effect.Upsert.SequenceColumn = "version"
		create(idc)
		holdsThenRecovers(name, messagingv1alpha1.ReasonColumnTypeMismatch, []string{`"version"`, "integer"}, func() {
			sinkExec("ALTER TABLE " + orders() + " ALTER COLUMN version TYPE bigint USING version::bigint")
		})
	})

	It("NoUniqueKey until a unique index covers the upsert key", func() {
		sinkExec("CREATE SCHEMA "+schema, "CREATE TABLE "+orders()+" (order_id text, status text, version bigint)")
		create(consumer())
		holdsThenRecovers(name, messagingv1alpha1.ReasonNoUniqueKey, []string{`"order_id"`, "CREATE UNIQUE INDEX"}, func() {
			sinkExec("CREATE UNIQUE INDEX ON " + orders() + " (order_id)")
		})
	})

	It("PermissionDenied until the role is granted SELECT and UPDATE", func() {
		role := "idc_fx_" + randomSuffix()
		sinkExec("CREATE ROLE "+role+" LOGIN", "GRANT CREATE ON DATABASE "+pgx.Identifier{testDB}.Sanitize()+" TO "+role,
			"CREATE SCHEMA "+schema+" AUTHORIZATION "+role,
			"CREATE TABLE "+orders()+" (order_id text PRIMARY KEY, status text, version bigint)",
			"GRANT INSERT ON "+orders()+" TO "+role)
		DeferCleanup(func() {
			conn, err := pgx.Connect(ctx, testDSN)
			Expect(err).NotTo(HaveOccurred())
			defer conn.Close(ctx)
			_, _ = conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			_, _ = conn.Exec(ctx, "DROP OWNED BY "+role)
			_, _ = conn.Exec(ctx, "DROP ROLE "+role)
		})
		setSecretData(name+"-db", map[string]string{"dsn": "postgres://" + role + "@127.0.0.1:5432/" + testDB + "?sslmode=disable"})
		create(consumer())
		holdsThenRecovers(name, messagingv1alpha1.ReasonPermissionDenied, []string{role, "UPDATE", "GRANT"}, func() {
			sinkExec("GRANT SELECT, UPDATE ON " + orders() + " TO " + role)
		})
	})

	It("StatementInvalid until the sql statement is fixed", func() {
		createOrdersTable(schema, "")
		idc := consumer()
		idc.Spec.Sink.Effect.Upsert = nil
		idc.Spec.Sink.Effect.SQL = &messagingv1alpha1.SQLEffect{
			Statement: "UPDATE " + orders() + " SET status = :status WHER order_id = :id",
			Params:    map[string]messagingv1alpha1.ValueExpression{"status": "$.status", "id": "$.orderId"},
		}
		create(idc)
		holdsThenRecovers(name, messagingv1alpha1.ReasonStatementInvalid, []string{"spec.sink.effect.sql.statement", "syntax"}, func() {
			update(name, func(idc *messagingv1alpha1.IdempotentConsumer) {
				idc.Spec.Sink.Effect.SQL.Statement = "UPDATE " + orders() + " SET status = :status WHERE order_id = :id"
			})
		})
	})

	It("stalls with InvalidSpec when a :name parameter is not in params", func() {
		createOrdersTable(schema, "")
		idc := consumer()
		idc.Spec.Sink.Effect.Upsert = nil
		idc.Spec.Sink.Effect.SQL = &messagingv1alpha1.SQLEffect{
			Statement: "UPDATE " + orders() + " SET status = :status WHERE order_id = :id",
			Params:    map[string]messagingv1alpha1.ValueExpression{"status": "$.status"},
		}
		create(idc)
		Eventually(condition(name, messagingv1alpha1.ConditionStalled), timeout, interval).Should(Equal("True/" + messagingv1alpha1.ReasonInvalidSpec))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionStalled)).To(ContainSubstring(":id"))
	})
})
