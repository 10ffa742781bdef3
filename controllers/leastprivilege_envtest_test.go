package controllers

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// The controller under the role a DBA grants: USAGE and CREATE on a schema
// the DBA made, SELECT, INSERT and UPDATE on the effect table, nothing on
// the database. Each missing grant is named in the condition exactly as it
// is to be run; once the DBA ran it, the resource gets Ready by itself.
var _ = Describe("a least-privilege sink role", func() {
	It("names the missing schema grant in InboxReady and the missing table grant in EffectReady, then gets Ready", func() {
		name := "least-" + randomSuffix()
		role := "idc_least_" + randomSuffix()
		schema := "lp_" + randomSuffix()
		stream := newStream(24 * time.Hour)
		s := pgx.Identifier{schema}.Sanitize()
		r := pgx.Identifier{role}.Sanitize()
		sinkExec("CREATE ROLE "+role+" LOGIN", "CREATE SCHEMA "+s, "GRANT USAGE ON SCHEMA "+s+" TO "+r,
			"CREATE TABLE "+s+".orders (order_id text PRIMARY KEY, status text, version bigint)",
			"GRANT SELECT, INSERT ON "+s+".orders TO "+r)
		DeferCleanup(func() {
			sinkExec("DROP SCHEMA "+s+" CASCADE", "DROP OWNED BY "+r, "DROP ROLE "+r)
		})
		Expect(sinkQueryBool("SELECT has_database_privilege($1, current_database(), 'CREATE')", role)).To(BeFalse(), "the role must not have CREATE on the database")
		newSecret(name+"-db", fmt.Sprintf("postgres://%s@127.0.0.1:5432/%s?sslmode=disable", role, testDB))
		idc := newConsumer(name, stream, name+"-db")
		idc.Spec.Sink.Postgres.Schema = messagingv1alpha1.SQLIdentifier(schema)
		create(idc)

		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("False/" + messagingv1alpha1.ReasonPermissionDenied))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionInboxReady)).To(ContainSubstring(
			fmt.Sprintf(`role %s lacks CREATE on schema %s (the inbox tables are created there); run GRANT CREATE ON SCHEMA %s TO %s`, r, s, s, r)))

		sinkExec("GRANT CREATE ON SCHEMA " + s + " TO " + r)
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		Eventually(condition(name, messagingv1alpha1.ConditionEffectReady), timeout, interval).Should(Equal("False/" + messagingv1alpha1.ReasonPermissionDenied))
		Expect(conditionMessage(name, messagingv1alpha1.ConditionEffectReady)).To(ContainSubstring(
			fmt.Sprintf(`role %s lacks UPDATE on column "status" of table %s.%s; run GRANT SELECT, INSERT, UPDATE ON %s.%s TO %s`, r, s, `"orders"`, s, `"orders"`, r)))

		sinkExec("GRANT UPDATE ON " + s + ".orders TO " + r)
		Eventually(condition(name, messagingv1alpha1.ConditionEffectReady), timeout, interval).Should(Equal("True/Ready"))
		markAvailable(name)
		Eventually(condition(name, messagingv1alpha1.ConditionReady), timeout, interval).Should(Equal("True/Ready"))
		Expect(sinkQueryBool("SELECT has_database_privilege($1, current_database(), 'CREATE')", role)).To(BeFalse())
	})
})

func sinkQueryBool(sql string, args ...any) bool {
	conn, err := pgx.Connect(ctx, testDSN)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	defer conn.Close(ctx)
	var b bool
	ExpectWithOffset(1, conn.QueryRow(ctx, sql, args...).Scan(&b)).To(Succeed())
	return b
}
