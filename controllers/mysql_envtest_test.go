package controllers

import (
	"database/sql"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
)

// mysqlExec runs statements on the machine's MariaDB as its admin.
func mysqlExec(stmts ...string) {
	db, err := sql.Open("mysql", mysqltest.AdminDSN())
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	defer func() { _ = db.Close() }()
	for _, s := range stmts {
		_, err := db.ExecContext(ctx, s)
		ExpectWithOffset(1, err).NotTo(HaveOccurred(), s)
	}
}

// mysqlDSN is a go-sql-driver DSN for user on the machine's MariaDB.
func mysqlDSN(user, password, database string) string {
	c := gomysql.NewConfig()
	c.User, c.Passwd, c.Net, c.Addr, c.DBName = user, password, "tcp", "127.0.0.1:3306", database
	return c.FormatDSN()
}

// A MySQL/MariaDB sink through the whole reconciler: the resource reaches
// Ready with its inbox in the database, and a sink only a person can fix
// stalls it with the statement to run, then recovers without a touch.
var _ = Describe("a MySQL sink", func() {
	var name, stream, database, user, password string

	BeforeEach(func() {
		name = "mysql-" + randomSuffix()
		stream = newStream(24 * time.Hour)
		database = "idc_fx_" + randomSuffix()
		user, password = "idc_fx_"+randomSuffix(), "pw-"+randomSuffix()
		mysqlExec("CREATE DATABASE `"+database+"`", "CREATE USER '"+user+"'@'%' IDENTIFIED BY '"+password+"'")
		DeferCleanup(func() { mysqlExec("DROP DATABASE IF EXISTS `"+database+"`", "DROP USER IF EXISTS '"+user+"'@'%'") })
		newSecret(name+"-db", mysqlDSN(user, password, database))
	})

	consumer := func() *messagingv1alpha1.IdempotentConsumer {
		idc := newConsumer(name, stream, name+"-db")
		idc.Spec.Sink.Postgres = nil
		idc.Spec.Sink.MySQL = &messagingv1alpha1.MySQLSpec{
			ConnectionSecretRef: messagingv1alpha1.SecretKeyRef{Name: name + "-db", Key: "dsn"},
			Database:            messagingv1alpha1.SQLIdentifier(database),
		}
		idc.Spec.Sink.Effect.Upsert.SequenceColumn = "version"
		return idc
	}
	ordersDDL := func() string {
		return "CREATE TABLE `" + database + "`.orders (order_id VARCHAR(64) PRIMARY KEY, status VARCHAR(32) NOT NULL, version BIGINT NOT NULL)"
	}

	It("holds with TableNotFound until the table exists, then is Ready with the inbox in the database", func() {
		mysqlExec(mysql.ControllerGrants(database, user+"@%")...)
		create(consumer())
		holdsThenRecovers(name, messagingv1alpha1.ReasonTableNotFound, []string{database, "orders", "CREATE TABLE"}, func() {
			mysqlExec(ordersDDL())
		})
		idc := get(name)
		Expect(idc.Status.Inbox).NotTo(BeNil())
		Expect(idc.Status.Inbox.Table).To(Equal(database + "." + string(idc.Spec.Sink.Inbox.Table)))
		// The physical database is named by the database itself (a UUID
		// minted there once), never by the Secret.
		Expect(idc.Status.Inbox.Database).To(HaveSuffix("/" + database))
		Expect(idc.Status.Inbox.Database).NotTo(HavePrefix("unknown/"))
		Expect(idc.Status.Inbox.Epoch).NotTo(BeEmpty())
	})

	It("stalls with PermissionDenied naming the controller's GRANT until it is run", func() {
		mysqlExec(ordersDDL(), "GRANT SELECT ON `"+database+"`.* TO '"+user+"'@'%'")
		create(consumer())
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("False/" + messagingv1alpha1.ReasonPermissionDenied))
		msg := conditionMessage(name, messagingv1alpha1.ConditionInboxReady)
		grant := mysql.ControllerGrants(database, user+"@%")[0]
		Expect(msg).To(ContainSubstring(grant), msg)
		Expect(msg).NotTo(ContainSubstring(password))
		Expect(condition(name, messagingv1alpha1.ConditionStalled)()).To(Equal("True/" + messagingv1alpha1.ReasonPermissionDenied))

		// The GRANT the message names, run as it stands: the next check
		// sees it (MySQL applies a database grant at a session's next USE).
		mysqlExec(grant)
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"),
			func() string { return conditionMessage(name, messagingv1alpha1.ConditionInboxReady) })
		Eventually(replicasOf(name), timeout, interval).Should(Equal(int32(2)))
		markAvailable(name)
		Eventually(condition(name, messagingv1alpha1.ConditionReady), timeout, interval).Should(Equal("True/Ready"))
		Expect(strings.Contains(conditionMessage(name, messagingv1alpha1.ConditionStalled), password)).To(BeFalse())
	})
})
