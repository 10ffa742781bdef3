package controllers

import (
	"reflect"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// The API server's admission of a MySQL sink (spec.sink.mysql): exactly one
// database, never switched; MySQL's identifiers (64 characters, the
// database's own rules) and PostgreSQL's kept (63); the <inbox>_* family of
// MySQL's derived names; the sql effect's statement as the MySQL dialect
// parses it. Each rejection names the field. As in admission_envtest_test.go,
// accepted variants are checked with a dry run.
var _ = Describe("admission of a MySQL sink", func() {
	const inboxTable = "inbox_adm_my"

	valid := func() *messagingv1alpha1.IdempotentConsumer {
		idc := newConsumer("adm-my-"+randomSuffix(), "ADMMY", "adm-db")
		idc.Spec.Sink.Inbox.Table = inboxTable
		return idc
	}
	dryRun := func(idc *messagingv1alpha1.IdempotentConsumer) error {
		return k8sClient.Create(ctx, idc, client.DryRunAll)
	}
	rejected := func(idc *messagingv1alpha1.IdempotentConsumer, field, want string) {
		GinkgoHelper()
		err := dryRun(idc)
		Expect(err).To(HaveOccurred(), "the API server accepted %s", field)
		Expect(err.Error()).To(ContainSubstring(field))
		Expect(err.Error()).To(ContainSubstring(want))
	}

	// onMySQL is valid() on a MySQL sink.
	onMySQL := func() *messagingv1alpha1.IdempotentConsumer {
		idc := valid()
		idc.Spec.Sink.Postgres = nil
		idc.Spec.Sink.MySQL = &messagingv1alpha1.MySQLSpec{
			ConnectionSecretRef: messagingv1alpha1.SecretKeyRef{Name: "adm-mysql", Key: "dsn"}, Database: "shop"}
		return idc
	}
	sqlEffect := func(stmt string) messagingv1alpha1.EffectSpec {
		return messagingv1alpha1.EffectSpec{SQL: &messagingv1alpha1.SQLEffect{Statement: stmt,
			Params: map[string]messagingv1alpha1.ValueExpression{"id": "$.id", "n": "$.n"}}}
	}

	It("accepts a MySQL sink with MySQL's 64-character identifiers, and refuses a sink with both databases or none, naming spec.sink", func() {
		long := strings.Repeat("c", 64)
		idc := onMySQL()
		idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier("i" + strings.Repeat("n", 63))
		idc.Spec.Sink.MySQL.Database = messagingv1alpha1.SQLIdentifier(strings.Repeat("d", 64))
		idc.Spec.Sink.Effect.Upsert = &messagingv1alpha1.UpsertEffect{
			Table: messagingv1alpha1.SQLIdentifier(long), Key: []messagingv1alpha1.SQLIdentifier{messagingv1alpha1.SQLIdentifier(long)},
			Columns:        messagingv1alpha1.Columns{long: "$.orderId", "version": "$.version", "s" + long[1:]: "$.status"},
			SequenceColumn: "version",
		}
		idc.Spec.Delivery.DeadLetter = &messagingv1alpha1.DeadLetterSpec{Table: messagingv1alpha1.SQLIdentifier("f" + long[1:])}
		idc.Spec.Sink.Inbox.Layout = messagingv1alpha1.InboxLayoutPartitioned
		Expect(dryRun(idc)).To(Succeed())
		for _, e := range []messagingv1alpha1.EffectSpec{
			{Append: &messagingv1alpha1.AppendEffect{Table: messagingv1alpha1.SQLIdentifier(long), Columns: messagingv1alpha1.Columns{long: "@payload"}}},
			{HTTP: &messagingv1alpha1.HTTPEffect{URL: "https://billing/charge", Delivery: messagingv1alpha1.HTTPDeliveryOutbox}},
			sqlEffect("INSERT INTO ledger (id, n) VALUES (:id, :n) ON DUPLICATE KEY UPDATE n = n + VALUES(n)"),
		} {
			idc := onMySQL()
			idc.Spec.Sink.Effect = e
			Expect(dryRun(idc)).To(Succeed(), "%+v", e)
		}

		idc = onMySQL()
		idc.Spec.Sink.Postgres = valid().Spec.Sink.Postgres
		rejected(idc, "spec.sink", "exactly one of postgres, mysql must be set")
		idc.Spec.Sink.Postgres, idc.Spec.Sink.MySQL = nil, nil
		rejected(idc, "spec.sink", "exactly one of postgres, mysql must be set")
	})

	It("refuses a MySQL database that is no identifier, too long, missing or a system database, naming spec.sink.mysql.database", func() {
		for _, db := range []string{"Shop", "1shop", "shop-eu", "shop.eu", strings.Repeat("d", 65)} {
			idc := onMySQL()
			idc.Spec.Sink.MySQL.Database = messagingv1alpha1.SQLIdentifier(db)
			rejected(idc, "spec.sink.mysql.database", "")
		}
		for _, db := range []string{"mysql", "information_schema", "performance_schema", "sys"} {
			idc := onMySQL()
			idc.Spec.Sink.MySQL.Database = messagingv1alpha1.SQLIdentifier(db)
			rejected(idc, "spec.sink.mysql.database", "must not be a system database")
		}
		for _, db := range []string{"_shop", "sys_orders", "mysql2", "s"} {
			idc := onMySQL()
			idc.Spec.Sink.MySQL.Database = messagingv1alpha1.SQLIdentifier(db)
			Expect(dryRun(idc)).To(Succeed(), db)
		}
		u := admissionUnstructured(onMySQL())
		unstructured.RemoveNestedField(u.Object, "spec", "sink", "mysql", "database")
		err := k8sClient.Create(ctx, u, client.DryRunAll)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("spec.sink.mysql.database"))
		Expect(err.Error()).To(ContainSubstring("Required value"))
		idc := onMySQL()
		idc.Spec.Sink.MySQL.ConnectionSecretRef.Key = ""
		rejected(idc, "spec.sink.mysql.connectionSecretRef.key", "")
	})

	// Admission refuses exactly the statements the runtime's MySQL parser
	// refuses for a positional parameter: the two are asked the same.
	It("refuses a positional ? in a MySQL sql statement outside quotes and comments, naming spec.sink.effect.sql.statement, as the runtime would", func() {
		for _, stmt := range []string{
			"UPDATE t SET n = ? WHERE id = :id",
			"UPDATE t SET n = :n WHERE id = ?",
			"UPDATE t SET s = 'it\\'s' WHERE id = ? AND n = :n",
			"UPDATE t SET s = 'a''b' WHERE id = ?",
			"UPDATE t SET n = :n /* a comment */ WHERE id = ?",
			"UPDATE t SET n = n --? not a comment in MySQL\nWHERE id = :id",
			"UPDATE t SET n = :n WHERE id=?",
			"UPDATE `t` SET n = :n WHERE id IN (?, :id)",
			"UPDATE t SET n = :n --\nWHERE id = ?",
			"UPDATE t SET n = :n # c\nWHERE id = ?",
		} {
			_, _, runtimeErr := effect.ConvertNamedParamsMySQL(stmt)
			Expect(runtimeErr).To(MatchError(ContainSubstring("positional parameter")), stmt)
			idc := onMySQL()
			idc.Spec.Sink.Effect = sqlEffect(stmt)
			rejected(idc, "spec.sink.effect.sql.statement", "a positional ? parameter is not supported on MySQL")
		}
		for _, stmt := range []string{
			"UPDATE t SET s = '?' WHERE id = :id",
			`UPDATE t SET s = "why?" WHERE id = :id`,
			"UPDATE t SET s = 'it\\'s ?' WHERE id = :id",
			"UPDATE t SET s = 'it''s ?' WHERE id = :id",
			"UPDATE `odd?name` SET n = :n WHERE id = :id",
			"UPDATE t SET n = :n -- why? because\nWHERE id = :id",
			"UPDATE t SET n = :n # why?\nWHERE id = :id",
			"UPDATE t SET n = :n /* why? */ WHERE id = :id",
			"UPDATE t SET n = :n WHERE id = :id -- ?",
		} {
			_, _, runtimeErr := effect.ConvertNamedParamsMySQL(stmt)
			Expect(runtimeErr).NotTo(HaveOccurred(), stmt)
			idc := onMySQL()
			idc.Spec.Sink.Effect = sqlEffect(stmt)
			Expect(dryRun(idc)).To(Succeed(), stmt)
		}
		// PostgreSQL's ? is the jsonb operator: not a parameter there.
		idc := valid()
		idc.Spec.Sink.Effect = sqlEffect("UPDATE t SET n = :n WHERE doc ? 'id' AND id = :id")
		Expect(dryRun(idc)).To(Succeed())
	})

	// MariaDB, asked the same (without multi-statements, as the runtime's
	// driver connects), accepts a ';' followed only by ';' or comments and
	// refuses a second command; admission reads MySQL's quotes and comments
	// where PostgreSQL's rule would not.
	It("refuses a second command in a MySQL sql statement, reading MySQL's quotes and comments, naming spec.sink.effect.sql.statement", func() {
		for _, stmt := range []string{
			"UPDATE t SET n = :n WHERE id = :id; DELETE FROM t",
			"UPDATE t SET n = :n WHERE id = :id;/* c */DELETE FROM t",
			"UPDATE t SET s = 'a\\\\'; DELETE FROM t WHERE id = :id",
			"UPDATE t SET n = :n -- c\n; DELETE FROM t WHERE id = :id",
			"UPDATE t SET n = :n WHERE id = :id;\n# c\nDELETE FROM t",
		} {
			idc := onMySQL()
			idc.Spec.Sink.Effect = sqlEffect(stmt)
			rejected(idc, "spec.sink.effect.sql.statement", "exactly one command")
		}
		for _, stmt := range []string{
			"UPDATE t SET s = 'it\\'s; fine' WHERE id = :id AND n = :n",
			`UPDATE t SET s = "a\"; b" WHERE id = :id AND n = :n`,
			"UPDATE t SET n = :n WHERE id = :id; -- done",
			"UPDATE t SET n = :n WHERE id = :id; # done",
			"UPDATE t SET n = :n WHERE id = :id; /* done; DELETE FROM t */",
			"UPDATE t SET n = :n /* ; DELETE FROM t */ WHERE id = :id;;",
			"UPDATE `a;b` SET n = :n WHERE id = :id",
		} {
			idc := onMySQL()
			idc.Spec.Sink.Effect = sqlEffect(stmt)
			Expect(dryRun(idc)).To(Succeed(), stmt)
		}
		// PostgreSQL's rule is unchanged: a backslash does not escape there.
		idc := valid()
		idc.Spec.Sink.Effect = sqlEffect("UPDATE t SET s = 'it\\'s; DELETE FROM t WHERE id = :id AND n = :n")
		rejected(idc, "spec.sink.effect.sql.statement", "exactly one command")
	})

	It("keeps PostgreSQL's 63-character identifiers, naming each field", func() {
		long := messagingv1alpha1.SQLIdentifier(strings.Repeat("x", 64))
		for field, mutate := range map[string]func(*messagingv1alpha1.IdempotentConsumer){
			"spec.sink.inbox.table":         func(i *messagingv1alpha1.IdempotentConsumer) { i.Spec.Sink.Inbox.Table = long },
			"spec.sink.postgres.schema":     func(i *messagingv1alpha1.IdempotentConsumer) { i.Spec.Sink.Postgres.Schema = long },
			"spec.sink.effect.upsert.table": func(i *messagingv1alpha1.IdempotentConsumer) { i.Spec.Sink.Effect.Upsert.Table = long },
			"spec.sink.effect.upsert.sequenceColumn": func(i *messagingv1alpha1.IdempotentConsumer) {
				i.Spec.Sink.Effect.Upsert.SequenceColumn = long
				i.Spec.Sink.Effect.Upsert.Columns[string(long)] = "$.version"
			},
			"spec.sink.effect.upsert.key": func(i *messagingv1alpha1.IdempotentConsumer) {
				i.Spec.Sink.Effect.Upsert.Key = []messagingv1alpha1.SQLIdentifier{long}
				i.Spec.Sink.Effect.Upsert.Columns[string(long)] = "$.orderId"
			},
			"spec.sink.effect.upsert.columns": func(i *messagingv1alpha1.IdempotentConsumer) { i.Spec.Sink.Effect.Upsert.Columns[string(long)] = "$.x" },
			"spec.sink.effect.append.table": func(i *messagingv1alpha1.IdempotentConsumer) {
				i.Spec.Sink.Effect = messagingv1alpha1.EffectSpec{Append: &messagingv1alpha1.AppendEffect{Table: long, Columns: messagingv1alpha1.Columns{"a": "$.a"}}}
			},
			"spec.sink.effect.append.columns": func(i *messagingv1alpha1.IdempotentConsumer) {
				i.Spec.Sink.Effect = messagingv1alpha1.EffectSpec{Append: &messagingv1alpha1.AppendEffect{Table: "t", Columns: messagingv1alpha1.Columns{string(long): "$.a"}}}
			},
			"spec.delivery.deadLetter.table": func(i *messagingv1alpha1.IdempotentConsumer) {
				i.Spec.Delivery.DeadLetter = &messagingv1alpha1.DeadLetterSpec{Table: long}
			},
		} {
			idc := valid()
			mutate(idc)
			rejected(idc, field, "at most 63 characters on PostgreSQL")
			// The same name is a MySQL identifier.
			if field != "spec.sink.postgres.schema" {
				my := onMySQL()
				mutate(my)
				Expect(dryRun(my)).To(Succeed(), field)
			}
		}
	})

	// mysqlTables are the tables the MySQL dialect creates for inbox: the
	// names of inbox.NamesForMax at 64 characters, its claim locks
	// (Partitioned) and its outbox's shards.
	mysqlTables := func(table string) []string {
		n := reflect.ValueOf(inbox.NamesForMax(config.Sink{InboxTable: table}, 64))
		var out []string
		for i := range n.NumField() {
			if f := n.Type().Field(i); f.Name != "Schema" && f.Type.Kind() == reflect.String {
				out = append(out, n.Field(i).String())
			}
		}
		Expect(len(out)).To(BeNumerically(">=", 9))
		outbox := inbox.NamesForMax(config.Sink{InboxTable: table}, 64).Outbox
		return append(out, inbox.DerivedNameMax(table, "_claim_locks", 64), inbox.DerivedNameMax(outbox, "_shards", 64))
	}

	It("reserves the <inbox>_* tables of MySQL's derived-name scheme (64 characters) for a MySQL sink, naming the table's field", func() {
		// 60 characters: every derived name is shortened with a hash.
		longInbox := "inbox_" + strings.Repeat("y", 54)
		for _, table := range []string{inboxTable, longInbox} {
			n := inbox.NamesForMax(config.Sink{InboxTable: table}, 64)
			for _, t := range mysqlTables(table) {
				if table == longInbox && t != table {
					Expect(t).NotTo(HavePrefix(table+"_"), "the long inbox's derived names must be the hashed ones")
					Expect(t).To(HaveLen(64))
				}
				idc := onMySQL()
				idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier(table)
				idc.Spec.Sink.Effect.Upsert.Table = messagingv1alpha1.SQLIdentifier(t)
				rejected(idc, "spec.sink.effect.upsert.table", "nor any other <inbox>_* name")

				idc = onMySQL()
				idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier(table)
				idc.Spec.Sink.Effect = messagingv1alpha1.EffectSpec{Append: &messagingv1alpha1.AppendEffect{
					Table: messagingv1alpha1.SQLIdentifier(t), Columns: messagingv1alpha1.Columns{"order_id": "$.orderId"}}}
				rejected(idc, "spec.sink.effect.append.table", "nor any other <inbox>_* name")

				idc = onMySQL()
				idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier(table)
				idc.Spec.Delivery.DeadLetter = &messagingv1alpha1.DeadLetterSpec{Table: messagingv1alpha1.SQLIdentifier(t)}
				if t == n.DeadLetters {
					Expect(dryRun(idc)).To(Succeed(), "the default dead-letter table %s", t)
					continue
				}
				rejected(idc, "spec.delivery.deadLetter.table", "nor an <inbox>_* name other than its default")
			}
		}
		// PostgreSQL's shortened names of the same long inbox (63
		// characters) are no table of a MySQL inbox, and neither is a name
		// that only shares its first 42 characters.
		for _, t := range []string{inbox.DerivedName(longInbox, "_dead_letters"), longInbox[:42] + "z_orders"} {
			idc := onMySQL()
			idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier(longInbox)
			idc.Spec.Sink.Effect.Upsert.Table = messagingv1alpha1.SQLIdentifier(t)
			Expect(dryRun(idc)).To(Succeed(), t)
		}
	})

	// updated is the API server's answer to a dry-run update of the stored
	// resource (read again while the manager's own writes conflict).
	updated := func(idc *messagingv1alpha1.IdempotentConsumer, mutate func(*messagingv1alpha1.IdempotentConsumer)) error {
		GinkgoHelper()
		var err error
		Eventually(func() bool {
			var cur messagingv1alpha1.IdempotentConsumer
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(idc), &cur)).To(Succeed())
			mutate(&cur)
			err = k8sClient.Update(ctx, &cur, client.DryRunAll)
			return !apierrors.IsConflict(err)
		}, timeout, interval).Should(BeTrue())
		return err
	}

	It("refuses to switch a sink between postgres and mysql, or to change the MySQL database, naming spec.sink", func() {
		pg := valid()
		create(pg)
		err := updated(pg, func(i *messagingv1alpha1.IdempotentConsumer) {
			i.Spec.Sink.Postgres, i.Spec.Sink.MySQL = nil, onMySQL().Spec.Sink.MySQL
		})
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("spec.sink"))
		Expect(err.Error()).To(ContainSubstring("cannot be switched between postgres and mysql"))
		Expect(err.Error()).To(ContainSubstring("forget every processed id"))

		my := onMySQL()
		create(my)
		err = updated(my, func(i *messagingv1alpha1.IdempotentConsumer) { i.Spec.Sink.MySQL.Database = "shop_eu" })
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("spec.sink.mysql.database"))
		Expect(err.Error()).To(ContainSubstring("database is immutable"))
		err = updated(my, func(i *messagingv1alpha1.IdempotentConsumer) {
			i.Spec.Sink.MySQL, i.Spec.Sink.Postgres = nil, valid().Spec.Sink.Postgres
		})
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("cannot be switched between postgres and mysql"))
		// A mutable field still changes.
		Expect(updated(my, func(i *messagingv1alpha1.IdempotentConsumer) { i.Spec.Delivery.BatchSize = 100 })).To(Succeed())
	})
})
