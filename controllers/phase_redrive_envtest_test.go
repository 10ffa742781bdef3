package controllers

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/redrive"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
)

// There is no Job controller or kubelet in envtest: these tests play both.
// They run the redrive the Job's container would run (same config from the
// ConfigMap, same --run and --reason arguments) in process against the real
// PostgreSQL, then mark the Job complete.

func redriveJobs(name string) []batchv1.Job {
	var list batchv1.JobList
	ExpectWithOffset(1, k8sClient.List(ctx, &list, client.InNamespace("default"),
		client.MatchingLabels{"app.kubernetes.io/instance": name, "app.kubernetes.io/component": specs.ComponentRedrive})).To(Succeed())
	return list.Items
}

func redriveJobFor(name, token string) func() *batchv1.Job {
	return func() *batchv1.Job {
		for _, j := range redriveJobs(name) {
			if j.Annotations[messagingv1alpha1.AnnotationRedrive] == token {
				return &j
			}
		}
		return nil
	}
}

func annotate(name string, kv ...string) {
	update(name, func(idc *messagingv1alpha1.IdempotentConsumer) {
		if idc.Annotations == nil {
			idc.Annotations = map[string]string{}
		}
		for i := 0; i < len(kv); i += 2 {
			idc.Annotations[kv[i]] = kv[i+1]
		}
	})
}

// playRedriveJob runs what the Job's container runs and marks the Job
// complete, as the Job controller would.
func playRedriveJob(name string, job *batchv1.Job) redrive.Result {
	c := job.Spec.Template.Spec.Containers[0]
	Expect(c.Command).To(Equal([]string{"/idc-runtime"}))
	Expect(c.Args[:3]).To(Equal([]string{"redrive", "--config", "/etc/idc/config.json"}))
	opts := redrive.Options{}
	for i := 3; i+1 < len(c.Args); i += 2 {
		switch c.Args[i] {
		case "--run":
			opts.Run = c.Args[i+1]
		case "--reason":
			opts.Filter.Classes = append(opts.Filter.Classes, c.Args[i+1])
		default:
			Fail("unexpected redrive argument " + c.Args[i])
		}
	}
	Expect(job.Spec.Template.Spec.Volumes).NotTo(BeEmpty())
	var cm corev1.ConfigMap
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-runtime"}, &cm)).To(Succeed())
	path := filepath.Join(GinkgoT().TempDir(), "config.json")
	Expect(os.WriteFile(path, []byte(cm.Data["config.json"]), 0o600)).To(Succeed())
	cfg, err := config.Load(path)
	Expect(err).NotTo(HaveOccurred())
	Expect(envByName(c, cfg.Sink.DSNEnv)).NotTo(BeNil(), "the Job gets the DSN from the Secret")
	pool, err := pgxpool.New(ctx, testDSN)
	Expect(err).NotTo(HaveOccurred())
	defer pool.Close()
	r, err := redrive.New(postgres.New(pool), cfg, logr.Discard())
	Expect(err).NotTo(HaveOccurred())
	res, err := r.Run(ctx, opts)
	Expect(err).NotTo(HaveOccurred())

	Eventually(func() error {
		var j batchv1.Job
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(job), &j); err != nil {
			return err
		}
		now := metav1.Now()
		start := metav1.NewTime(now.Add(-time.Second))
		j.Status = batchv1.JobStatus{StartTime: &start, CompletionTime: &now, Succeeded: 1,
			Conditions: []batchv1.JobCondition{
				{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
				{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
			}}
		return k8sClient.Status().Update(ctx, &j)
	}, timeout, interval).Should(Succeed())
	return res
}

func countOf(list []string, s string) int {
	n := 0
	for _, v := range list {
		if v == s {
			n++
		}
	}
	return n
}

func lastRedrive(name string) func() *messagingv1alpha1.RedriveRunStatus {
	return func() *messagingv1alpha1.RedriveRunStatus { return get(name).Status.LastRedrive }
}

func eventReasons(name string) func() []string {
	return func() []string {
		var list eventsv1.EventList
		Expect(k8sClient.List(ctx, &list, client.InNamespace("default"))).To(Succeed())
		var out []string
		for _, e := range list.Items {
			if e.Regarding.Kind == "IdempotentConsumer" && e.Regarding.Name == name {
				out = append(out, e.Reason)
			}
		}
		return out
	}
}

// seedDeadLetters writes three dead letters as the loop would have: one
// that applies, one stale (the orders row is at a newer version), one
// without its id header.
func seedDeadLetters(table string, sink config.Sink) {
	conn, err := pgx.Connect(ctx, testDSN)
	Expect(err).NotTo(HaveOccurred())
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO projections.orders VALUES ('`+table+`-o2', 'shipped', 9) ON CONFLICT DO NOTHING`)
	Expect(err).NotTo(HaveOccurred())
	pool, err := pgxpool.New(ctx, testDSN)
	Expect(err).NotTo(HaveOccurred())
	defer pool.Close()
	store, err := inbox.New(pool, sink)
	Expect(err).NotTo(HaveOccurred())
	body := func(order string, version int) []byte {
		b, _ := json.Marshal(map[string]any{"orderId": table + "-" + order, "status": "created", "version": version})
		return b
	}
	rows := []inbox.DeadLetter{
		{MessageID: table + "-e1", NativeID: table + ":1", Reason: "database: ERROR: the bug", Payload: body("o1", 1), Headers: map[string]string{"Nats-Msg-Id": table + "-e1"}, Attempts: 5},
		{MessageID: table + "-e2", NativeID: table + ":2", Reason: "database: ERROR: the bug", Payload: body("o2", 3), Headers: map[string]string{"Nats-Msg-Id": table + "-e2"}, Attempts: 5},
		{NativeID: table + ":3", Reason: "database: ERROR: the bug", Payload: body("o3", 1), Attempts: 1},
	}
	Expect(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := store.DeadLetter(ctx, tx, rows)
		return err
	})).To(Succeed())
}

var _ = Describe("Redrive through the annotation", func() {
	var name, stream, secret string

	BeforeEach(func() {
		name = "redrive-" + randomSuffix()
		stream = newStream(48 * time.Hour)
		secret = name + "-db"
		newSecret(secret, testDSN)
	})

	It("runs one Job per token, never two at once, and fills status.lastRedrive with events", func() {
		idc := newConsumer(name, stream, secret)
		create(idc)
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		rc, err := renderConfig(get(name))
		Expect(err).NotTo(HaveOccurred())
		table := string(idc.Spec.Sink.Inbox.Table)
		seedDeadLetters(table, rc.Config.Sink)

		annotate(name, messagingv1alpha1.AnnotationRedrive, "t1", messagingv1alpha1.AnnotationRedriveReason, "database")
		Eventually(redriveJobFor(name, "t1"), timeout, interval).ShouldNot(BeNil())
		job := redriveJobFor(name, "t1")()
		Expect(job.OwnerReferences).To(HaveLen(1))
		Expect(job.Spec.Template.Spec.Containers[0].Args).To(Equal([]string{"redrive", "--config", "/etc/idc/config.json", "--run", "t1", "--reason", "database"}))
		Expect(*job.Spec.Template.Spec.SecurityContext.RunAsNonRoot).To(BeTrue(), "the prune job's pod template")
		Eventually(lastRedrive(name), timeout, interval).Should(HaveField("Phase", messagingv1alpha1.RedriveRunning))
		Eventually(eventReasons(name), timeout, interval).Should(ContainElement(eventRedriveStarted))

		// A new token while t1 runs waits for it. An annotation moves no
		// generation: the spec changes in the same update, so the pass that
		// observes the new generation is one that saw t2.
		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) {
			idc.Annotations[messagingv1alpha1.AnnotationRedrive] = "t2"
			idc.Annotations[messagingv1alpha1.AnnotationRedriveReason] = ""
			idc.Spec.Delivery.MaxAttempts = 7
		})
		Eventually(generationObserved(name), timeout, interval).Should(Succeed())
		Consistently(func() int { return len(redriveJobs(name)) }, 3*time.Second, interval).Should(Equal(1))

		res := playRedriveJob(name, job)
		Expect(res).To(Equal(redrive.Result{Run: "t1", Selected: 3, Applied: 1, Stale: 1, Unusable: 1}))

		// t1's end is recorded, then t2 starts.
		Eventually(redriveJobFor(name, "t2"), timeout, interval).ShouldNot(BeNil())
		Expect(countOf(eventReasons(name)(), eventRedriveFinished)).To(Equal(1))
		job2 := redriveJobFor(name, "t2")()
		Expect(job2.Spec.Template.Spec.Containers[0].Args).To(Equal([]string{"redrive", "--config", "/etc/idc/config.json", "--run", "t2"}))
		Expect(playRedriveJob(name, job2)).To(Equal(redrive.Result{Run: "t2", Selected: 1, Unusable: 1}))
		Eventually(lastRedrive(name), timeout, interval).Should(HaveField("Phase", messagingv1alpha1.RedriveSucceeded))
		st := get(name).Status.LastRedrive
		Expect(st.Token).To(Equal("t2"))
		Expect(st.Time).NotTo(BeNil())
		Expect([]int32{st.Selected, st.Applied, st.Duplicates, st.Stale, st.StillFailing, st.Unusable}).To(Equal([]int32{1, 0, 0, 0, 0, 1}))
		Expect(countOf(eventReasons(name)(), eventRedriveFinished)).To(Equal(2))

		// The same token again runs nothing, even after its Job is gone: a
		// pass after the Job's deletion (the spec change) observes it.
		Expect(k8sClient.Delete(ctx, job2, client.PropagationPolicy(metav1.DeletePropagationBackground))).To(Succeed())
		Eventually(redriveJobFor(name, "t2"), timeout, interval).Should(BeNil())
		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) { idc.Spec.Delivery.MaxAttempts = 6 })
		Eventually(generationObserved(name), timeout, interval).Should(Succeed())
		Consistently(func() []string {
			var out []string
			for _, j := range redriveJobs(name) {
				out = append(out, j.Annotations[messagingv1alpha1.AnnotationRedrive])
			}
			return out
		}, 3*time.Second, interval).Should(Equal([]string{"t1"}))

		// The applied and stale rows are gone; the row without an id stays.
		conn, err := pgx.Connect(ctx, testDSN)
		Expect(err).NotTo(HaveOccurred())
		defer conn.Close(ctx)
		var left int
		Expect(conn.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM projections.%s_dead_letters", table)).Scan(&left)).To(Succeed())
		Expect(left).To(Equal(1))
		var version int
		Expect(conn.QueryRow(ctx, "SELECT version FROM projections.orders WHERE order_id = $1", table+"-o2").Scan(&version)).To(Succeed())
		Expect(version).To(Equal(9), "the stale redriven update was refused")
	})

	It("refuses an unknown reason class, naming the annotation", func() {
		create(newConsumer(name, stream, secret))
		Eventually(condition(name, messagingv1alpha1.ConditionInboxReady), timeout, interval).Should(Equal("True/Provisioned"))
		annotate(name, messagingv1alpha1.AnnotationRedrive, "bad", messagingv1alpha1.AnnotationRedriveReason, "poison")
		Eventually(lastRedrive(name), timeout, interval).Should(HaveField("Phase", messagingv1alpha1.RedriveFailed))
		Expect(get(name).Status.LastRedrive.Message).To(ContainSubstring(messagingv1alpha1.AnnotationRedriveReason))
		Expect(strings.Join(eventReasons(name)(), ",")).To(ContainSubstring(eventRedriveFailed))
		Expect(redriveJobs(name)).To(BeEmpty())
	})
})
