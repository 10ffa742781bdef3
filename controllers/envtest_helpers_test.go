package controllers

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

const (
	timeout  = 60 * time.Second
	interval = 200 * time.Millisecond
)

// newStream creates a JetStream stream with the given MaxAge (0: unbounded).
func newStream(maxAge time.Duration) string {
	name := "CTRL_" + strings.ToUpper(randomSuffix())
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}, MaxAge: maxAge})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = js.DeleteStream(ctx, name) })
	return name
}

func setStreamMaxAge(name string, maxAge time.Duration) {
	s, err := js.Stream(ctx, name)
	Expect(err).NotTo(HaveOccurred())
	c := s.CachedInfo().Config
	c.MaxAge = maxAge
	_, err = js.UpdateStream(ctx, c)
	Expect(err).NotTo(HaveOccurred())
}

func newSecret(name, dsn string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, StringData: map[string]string{"dsn": dsn}}
	Expect(k8sClient.Create(ctx, s)).To(Succeed())
	DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, s))).To(Succeed()) })
	return s
}

func setSecretData(name string, data map[string]string) {
	var s corev1.Secret
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &s)).To(Succeed())
	s.StringData = data
	Expect(k8sClient.Update(ctx, &s)).To(Succeed())
}

// newConsumer is a JetStream -> PostgreSQL upsert resource, like the sample.
func newConsumer(name, stream, secret string) *messagingv1alpha1.IdempotentConsumer {
	return &messagingv1alpha1.IdempotentConsumer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: messagingv1alpha1.IdempotentConsumerSpec{
			Source: messagingv1alpha1.SourceSpec{NATSJetStream: &messagingv1alpha1.NATSJetStreamSource{
				URL: natsURL, Stream: stream, Consumer: name,
			}},
			Message: messagingv1alpha1.MessageSpec{
				ID: messagingv1alpha1.IDSpec{Header: "Nats-Msg-Id"},
				Entity: &messagingv1alpha1.EntitySpec{
					Key:      messagingv1alpha1.FieldSpec{JSONPath: "$.orderId"},
					Sequence: messagingv1alpha1.FieldSpec{JSONPath: "$.version"},
				},
			},
			Sink: messagingv1alpha1.SinkSpec{
				Postgres: &messagingv1alpha1.PostgresSpec{ConnectionSecretRef: messagingv1alpha1.SecretKeyRef{Name: secret, Key: "dsn"}, Schema: "projections"},
				Inbox:    messagingv1alpha1.InboxSpec{Table: messagingv1alpha1.SQLIdentifier("inbox_" + strings.ReplaceAll(name, "-", "_"))},
				Effect: messagingv1alpha1.EffectSpec{Upsert: &messagingv1alpha1.UpsertEffect{
					Table: "orders", Key: []messagingv1alpha1.SQLIdentifier{"order_id"},
					Columns: messagingv1alpha1.Columns{"order_id": "$.orderId", "status": "$.status", "version": "$.version"},
				}},
			},
			Runtime: messagingv1alpha1.RuntimeSpec{
				Replicas:  ptr.To(int32(2)),
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}},
			},
		},
	}
}

func create(idc *messagingv1alpha1.IdempotentConsumer) {
	Expect(k8sClient.Create(ctx, idc)).To(Succeed())
	DeferCleanup(func() {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, idc))).To(Succeed())
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(idc), &messagingv1alpha1.IdempotentConsumer{}))
		}, timeout, interval).Should(BeTrue())
	})
}

func get(name string) *messagingv1alpha1.IdempotentConsumer {
	var idc messagingv1alpha1.IdempotentConsumer
	ExpectWithOffset(1, k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &idc)).To(Succeed())
	return &idc
}

func update(name string, mutate func(*messagingv1alpha1.IdempotentConsumer)) {
	Eventually(func() error {
		idc := get(name)
		mutate(idc)
		return k8sClient.Update(ctx, idc)
	}, timeout, interval).Should(Succeed())
}

// condition returns "Status/Reason" of a condition, for compact assertions.
func condition(name, typ string) func() string {
	return func() string {
		c := meta.FindStatusCondition(get(name).Status.Conditions, typ)
		if c == nil {
			return ""
		}
		return string(c.Status) + "/" + c.Reason
	}
}

func conditionMessage(name, typ string) string {
	c := meta.FindStatusCondition(get(name).Status.Conditions, typ)
	if c == nil {
		return ""
	}
	return c.Message
}

func windowOf(name string) func() string {
	return func() string {
		if r := get(name).Status.Retention; r != nil {
			return r.Window
		}
		return ""
	}
}

func deployment(name string) *appsv1.Deployment {
	var d appsv1.Deployment
	ExpectWithOffset(1, k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &d)).To(Succeed())
	return &d
}

// podAnnotation reads a pod-template annotation, "" while the Deployment is
// not there yet (for Eventually).
func podAnnotation(name, key string) func() string {
	return func() string {
		var d appsv1.Deployment
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &d); err != nil {
			return ""
		}
		return d.Spec.Template.Annotations[key]
	}
}

func cronJob(name string) *batchv1.CronJob {
	var c batchv1.CronJob
	ExpectWithOffset(1, k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-prune"}, &c)).To(Succeed())
	return &c
}

// markAvailable plays the Deployment controller: the Deployment reports its
// replicas ready and Available.
func markAvailable(name string) {
	Eventually(func() error {
		d := &appsv1.Deployment{}
		if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, d); err != nil {
			return err
		}
		n := ptr.Deref(d.Spec.Replicas, 1)
		d.Status = appsv1.DeploymentStatus{
			ObservedGeneration: d.Generation, Replicas: n, ReadyReplicas: n, AvailableReplicas: n, UpdatedReplicas: n,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable", Message: "ok",
				LastUpdateTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		}
		return k8sClient.Status().Update(ctx, d)
	}, timeout, interval).Should(Succeed())
}

func tableExists(schema, table string) bool {
	conn, err := pgx.Connect(ctx, testDSN)
	Expect(err).NotTo(HaveOccurred())
	defer conn.Close(ctx)
	var ok bool
	Expect(conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{schema, table}.Sanitize()).Scan(&ok)).To(Succeed())
	return ok
}

func configMapVersion(name string) string {
	var cm corev1.ConfigMap
	ExpectWithOffset(1, k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-runtime"}, &cm)).To(Succeed())
	return cm.ResourceVersion
}

func reconcileTotal() float64 {
	families, err := ctrlmetrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelValue(m, "controller") == "idempotentconsumer" {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func envByName(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// tableRow reads the resource through the API server's Table output (what
// kubectl get prints) and returns its cells by column name.
func tableRow(name string) map[string]any {
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	raw, err := cs.RESTClient().Get().
		AbsPath("/apis/messaging.idempotency.dev/v1alpha1/namespaces/default/idempotentconsumers", name).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Raw()
	Expect(err).NotTo(HaveOccurred())
	var table metav1.Table
	Expect(json.Unmarshal(raw, &table)).To(Succeed())
	Expect(table.Rows).To(HaveLen(1))
	out := map[string]any{}
	for i, c := range table.ColumnDefinitions {
		out[c.Name] = table.Rows[0].Cells[i]
	}
	return out
}
