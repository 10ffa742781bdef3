package controllers

import (
	"reflect"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/robfig/cron/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// The API server's admission of IdempotentConsumer specs that the operator
// could not act on: effect or dead-letter tables among the inbox's own, a
// service account or pod annotation the pods would be refused for, requests
// above limits, a prune schedule the CronJob API would refuse. Each rejection
// must name the field. Accepted variants are checked with a dry run, so the
// manager never reconciles them.
var _ = Describe("admission", func() {
	const inboxTable = "inbox_adm"

	// valid is newConsumer with a fixed inbox table; the stream and Secret
	// need not exist for admission.
	valid := func() *messagingv1alpha1.IdempotentConsumer {
		idc := newConsumer("adm-"+randomSuffix(), "ADM", "adm-db")
		idc.Spec.Sink.Inbox.Table = inboxTable
		return idc
	}
	dryRun := func(idc *messagingv1alpha1.IdempotentConsumer) error {
		return k8sClient.Create(ctx, idc, client.DryRunAll)
	}
	// rejected asserts the API server refuses idc naming field, and that the
	// reason holds want.
	rejected := func(idc *messagingv1alpha1.IdempotentConsumer, field, want string) {
		GinkgoHelper()
		err := dryRun(idc)
		Expect(err).To(HaveOccurred(), "the API server accepted %s", field)
		Expect(err.Error()).To(ContainSubstring(field))
		Expect(err.Error()).To(ContainSubstring(want))
	}

	// operatorTables are the tables the operator creates for inbox: every
	// table name of the runtime's inbox.Names (read by reflection, so a table
	// added there is covered here) and two daily partitions.
	operatorTables := func(table string) []string {
		n := reflect.ValueOf(inbox.NamesFor(config.Sink{InboxTable: table}))
		var out []string
		for i := range n.NumField() {
			if f := n.Type().Field(i); f.Name != "Schema" && f.Type.Kind() == reflect.String {
				out = append(out, n.Field(i).String())
			}
		}
		Expect(len(out)).To(BeNumerically(">=", 9))
		return append(out, inbox.DerivedName(table, "_p20260101"), inbox.DerivedName(table, "_p20991231"))
	}
	// longInbox is 55 characters: every derived name is shortened with a hash.
	longInbox := "inbox_" + strings.Repeat("x", 49)

	It("rejects an upsert or append table that is one of the inbox's tables, naming the effect's table", func() {
		for _, table := range []string{inboxTable, longInbox} {
			names := operatorTables(table)
			if table == longInbox {
				Expect(names[len(names)-1]).NotTo(HavePrefix(table+"_"), "the long inbox's derived names must be the hashed ones")
			}
			for _, t := range names {
				idc := valid()
				idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier(table)
				idc.Spec.Sink.Effect.Upsert.Table = messagingv1alpha1.SQLIdentifier(t)
				rejected(idc, "spec.sink.effect.upsert.table", "must not be the inbox table or the dead-letter table")

				idc = valid()
				idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier(table)
				idc.Spec.Sink.Effect = messagingv1alpha1.EffectSpec{Append: &messagingv1alpha1.AppendEffect{
					Table: messagingv1alpha1.SQLIdentifier(t), Columns: messagingv1alpha1.Columns{"order_id": "$.orderId"}}}
				rejected(idc, "spec.sink.effect.append.table", "nor any other <inbox>_* name")
			}
		}
		// A future table of the family is reserved as well.
		idc := valid()
		idc.Spec.Sink.Effect.Upsert.Table = inboxTable + "_orders"
		rejected(idc, "spec.sink.effect.upsert.table", "nor any other <inbox>_* name")
	})

	It("rejects a dead-letter table among the inbox's other tables, naming spec.delivery.deadLetter.table, and admits its default", func() {
		for _, table := range []string{inboxTable, longInbox} {
			n := inbox.NamesFor(config.Sink{InboxTable: table})
			for _, t := range operatorTables(table) {
				idc := valid()
				idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier(table)
				idc.Spec.Delivery.DeadLetter = &messagingv1alpha1.DeadLetterSpec{Table: messagingv1alpha1.SQLIdentifier(t)}
				if t == n.DeadLetters {
					// The operator's own default, written out, stays allowed.
					Expect(dryRun(idc)).To(Succeed(), t)
					continue
				}
				rejected(idc, "spec.delivery.deadLetter.table", "nor an <inbox>_* name other than its default")
			}
		}
		idc := valid()
		idc.Spec.Delivery.DeadLetter = &messagingv1alpha1.DeadLetterSpec{Table: inboxTable + "_failed"}
		rejected(idc, "spec.delivery.deadLetter.table", "nor an <inbox>_* name other than its default")

		// Outside the family, and a name that only starts like the inbox's.
		for _, t := range []string{"failed_messages", inboxTable + "s_dead_letters", "inbox_ad_dead_letters"} {
			idc := valid()
			idc.Spec.Delivery.DeadLetter = &messagingv1alpha1.DeadLetterSpec{Table: messagingv1alpha1.SQLIdentifier(t)}
			Expect(dryRun(idc)).To(Succeed(), t)
		}
		// The effect table outside the family, beside a long inbox.
		idc = valid()
		idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier(longInbox)
		idc.Spec.Sink.Effect.Upsert.Table = messagingv1alpha1.SQLIdentifier(longInbox[:41] + "y_orders")
		Expect(dryRun(idc)).To(Succeed())
	})

	It("rejects a serviceAccountName that is not a DNS-1123 subdomain, naming spec.runtime.serviceAccountName", func() {
		for _, sa := range []string{"Runtime", "idc_runtime", "-idc", "idc-", "idc..runtime", "idc runtime", strings.Repeat("a", 254)} {
			idc := valid()
			idc.Spec.Runtime.ServiceAccountName = sa
			rejected(idc, "spec.runtime.serviceAccountName", "")
		}
		for _, sa := range []string{"idc-runtime", "idc.runtime.v1", "0", strings.Repeat("a", 63) + "." + strings.Repeat("b", 63)} {
			idc := valid()
			idc.Spec.Runtime.ServiceAccountName = sa
			Expect(dryRun(idc)).To(Succeed(), sa)
		}
	})

	It("rejects pod annotation keys that are not qualified names, naming spec.runtime.podAnnotations", func() {
		for _, key := range []string{"", "has space", "a/b/c", "/name", "prefix_with_underscore/name", "example.com/", "-lead",
			"example.com/" + strings.Repeat("n", 64), strings.Repeat("p", 254) + "/name"} {
			idc := valid()
			idc.Spec.Runtime.PodAnnotations = map[string]string{"ok": "1", key: "v"}
			rejected(idc, "spec.runtime.podAnnotations", "pod annotation keys must be qualified names")
		}
		idc := valid()
		idc.Spec.Runtime.PodAnnotations = map[string]string{
			"prometheus.io/scrape": "true", "Example.COM/Team_Name": "x", "checksum": "y", "a.b-c_d": "z",
			"example.com/" + strings.Repeat("n", 63): "max name", strings.Repeat("p", 253) + "/name": "max prefix",
		}
		Expect(dryRun(idc)).To(Succeed())
	})

	It("rejects cpu, memory or ephemeral-storage requests above their limits, naming spec.runtime.resources.requests[<resource>]", func() {
		idc := valid()
		idc.Spec.Runtime.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi")},
		}
		rejected(idc, "spec.runtime.resources.requests[cpu]", "the cpu request must not exceed the cpu limit")
		Expect(dryRun(idc).Error()).NotTo(ContainSubstring("memory"))

		// Equal, smaller, without a limit for that resource, and as plain integers.
		idc = valid()
		idc.Spec.Runtime.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi"),
				corev1.ResourceEphemeralStorage: resource.MustParse("10Gi")},
			Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0.5"), corev1.ResourceMemory: resource.MustParse("2Gi")},
		}
		Expect(dryRun(idc)).To(Succeed())
		u := admissionUnstructured(valid())
		Expect(unstructured.SetNestedField(u.Object, map[string]any{
			"requests": map[string]any{"cpu": int64(2)}, "limits": map[string]any{"cpu": int64(1)},
		}, "spec", "runtime", "resources")).To(Succeed())
		err := k8sClient.Create(ctx, u, client.DryRunAll)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("spec.runtime.resources.requests[cpu]"))
		Expect(err.Error()).To(ContainSubstring("the cpu request must not exceed the cpu limit"))
		unstructured.RemoveNestedField(u.Object, "spec", "runtime", "resources", "limits")
		Expect(k8sClient.Create(ctx, u, client.DryRunAll)).To(Succeed())
	})

	// The CronJob API validates schedules with robfig/cron's standard parser;
	// admission must agree with it, except where it is knowingly stricter.
	It("rejects a prune schedule outside cron's ranges, naming spec.retention.prune.schedule, as the CronJob API would", func() {
		agree := []string{
			// accepted
			"*/30 * * * *", "0 0 * * *", "59 23 31 12 6", "0 0 1 1 0", "0-59 0-23 1-31 1-12 0-6",
			"*/15 9-17 * * MON-FRI", "0 12 * JAN,jul SUN", "5,10,15-20/2 */2 1-31/5 ? *", "30 4 1/3 * *",
			"0 0 * Jan-Mar,Oct-Dec sat", "0 0 * * 1-5/2", "00 07 * * *", "*/1 * * * *",
			"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually",
			// rejected
			"60 * * * *", "* 24 * * *", "* * 0 * *", "* * 32 * *", "* * * 0 *", "* * * 13 *", "* * * * 7",
			"*/0 * * * *", "5-1 * * * *", "* * * * FRI-MON", "* * * MON *", "* * * * JAN",
			"0-60 * * * *", "* * * * 0-7", "1-2-3 * * * *", "*/5/2 * * * *", "a * * * *", "0 0 * * * *",
			"0 0 * *", "@reboot", "every minute", "1/0 * * * *", "-1 * * * *", "* * 1-32 * *", "* * * * MON/0", "",
		}
		// Odd forms robfig/cron tolerates that admission refuses.
		stricter := []string{"*-5 * * * *", "+5 * * * *", "00005 * * * *", "0  0 * * *", "@every 1h", "*/10000 * * * *", "1,,2 * * * *"}
		// Every field's edge values, ranges and steps, the others '*'.
		tokens := []string{"0", "1", "6", "7", "12", "13", "23", "24", "31", "32", "59", "60", "*", "?", "*/0", "*/7", "2/3",
			"1-5", "5-1", "0-59", "1-12", "0-6", "1-31", "3-3/2", "JAN", "jan-Mar", "DEC", "SUN", "mon-FRI", "sat", "FRI-MON", "SEP/2", "1,JAN,3"}
		for field := range 5 {
			for _, tok := range tokens {
				f := []string{"*", "*", "*", "*", "*"}
				f[field] = tok
				agree = append(agree, strings.Join(f, " "))
			}
		}
		for _, s := range append(agree, stricter...) {
			_, cronErr := cron.ParseStandard(s)
			idc := valid()
			idc.Spec.Retention.Prune.Schedule = s
			err := dryRun(idc)
			if err != nil {
				Expect(err.Error()).To(ContainSubstring("spec.retention.prune.schedule"), s)
			}
			if s == "" {
				// The default fills an empty schedule in.
				Expect(err).NotTo(HaveOccurred())
				continue
			}
			if cronErr == nil && !slices.Contains(stricter, s) {
				Expect(err).NotTo(HaveOccurred(), "%q: the CronJob API accepts it", s)
			} else {
				Expect(err).To(HaveOccurred(), "%q: %v", s, cronErr)
			}
			if slices.Contains(stricter, s) {
				Expect(cronErr).NotTo(HaveOccurred(), "%q is no longer a case where admission is stricter", s)
			}
		}
		idc := valid()
		idc.Spec.Retention.Prune.Schedule = "0 25 * * *"
		rejected(idc, "spec.retention.prune.schedule", "schedule must be valid cron")
	})

	It("still applies a valid manifest that leaves every default to the CRD", func() {
		idc := valid()
		idc.Spec.Delivery = messagingv1alpha1.DeliverySpec{}
		idc.Spec.Retention = messagingv1alpha1.RetentionSpec{}
		idc.Spec.Runtime = messagingv1alpha1.RuntimeSpec{}
		idc.Spec.Sink.Postgres.Schema = ""
		create(idc)
		got := get(idc.Name)
		Expect(got.Spec.Retention.Prune.Schedule).To(Equal("*/30 * * * *"))
		Expect(got.Spec.Delivery.BatchSize).To(Equal(int32(500)))
		Expect(got.Spec.Sink.Postgres.Schema).To(Equal(messagingv1alpha1.SQLIdentifier("public")))
		Expect(*got.Spec.Runtime.Replicas).To(Equal(int32(1)))
		Expect(got.Spec.Delivery.DeadLetter).To(BeNil())
	})
})

// admissionUnstructured converts a typed resource, for specs that need a value the
// Go types cannot hold (a quantity written as a JSON integer).
func admissionUnstructured(idc *messagingv1alpha1.IdempotentConsumer) *unstructured.Unstructured {
	GinkgoHelper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(idc)
	Expect(err).NotTo(HaveOccurred())
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(messagingv1alpha1.GroupVersion.String())
	u.SetKind("IdempotentConsumer")
	return u
}
