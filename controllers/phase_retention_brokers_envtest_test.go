package controllers

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

const (
	amqpURL       = "amqp://guest:guest@127.0.0.1:5672/"
	rabbitMgmtURL = "http://127.0.0.1:15672"
)

// windowAfterNudges re-reads the window, touching the Secret each time so
// the controller derives again without waiting for its period.
func windowAfterNudges(name, secret string, data map[string]string) func() string {
	return func() string {
		// A reading is fresh for --retention-period: step past it.
		clk.Step(6 * time.Minute)
		d := map[string]string{"nudge": randomSuffix()}
		for k, v := range data {
			d[k] = v
		}
		setSecretData(secret, d)
		return windowOf(name)()
	}
}

func cronWindowArg(name string) func() string {
	return func() string {
		var cj = cronJob(name)
		args := cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args
		return args[len(args)-1]
	}
}

var _ = Describe("retention follows the broker", func() {
	It("follows a Kafka topic's retention.ms (kfake)", func() {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(cluster.Close)
		cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(cl.Close)
		adm := kadm.NewClient(cl)
		topic := "orders-" + randomSuffix()
		retentionMs, segmentMs := "172800000", "3600000" // 48h, 1h
		_, err = adm.CreateTopic(ctx, 1, 1, map[string]*string{"retention.ms": &retentionMs, "segment.ms": &segmentMs}, topic)
		Expect(err).NotTo(HaveOccurred())

		name := "kafka-" + randomSuffix()
		secret := name + "-db"
		newSecret(secret, testDSN)
		idc := newConsumer(name, "unused", secret)
		idc.Spec.Source = messagingv1alpha1.SourceSpec{Kafka: &messagingv1alpha1.KafkaSource{
			BootstrapServers: cluster.ListenAddrs(), Topics: []string{topic}, ConsumerGroup: name,
		}}
		create(idc)
		// L = 48h; R_replay = retention.ms + segment.ms = 49h; W = 49h + 1h.
		Eventually(windowOf(name), timeout, interval).Should(Equal("50h"))
		Expect(get(name).Status.Retention.DerivedFrom).To(ContainSubstring("retention.ms=172800000"))

		longer := "259200000" // 72h
		_, err = adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: &longer}}, topic)
		Expect(err).NotTo(HaveOccurred())
		Eventually(windowAfterNudges(name, secret, map[string]string{"dsn": testDSN}), timeout, time.Second).Should(Equal("74h"))
		Eventually(cronWindowArg(name), timeout, interval).Should(Equal("74h0m0s"))
	})

	It("follows a RabbitMQ queue's message TTL set by policy (management API)", func() {
		conn, err := amqp.Dial(amqpURL)
		Expect(err).NotTo(HaveOccurred(), "RabbitMQ must run on 127.0.0.1:5672 (make services)")
		DeferCleanup(conn.Close)
		ch, err := conn.Channel()
		Expect(err).NotTo(HaveOccurred())
		queue := "idc-ctrl-" + randomSuffix()
		_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
		policy := "idc-ctrl-ttl-" + randomSuffix()
		setTTLPolicy(policy, queue, time.Hour)
		DeferCleanup(func() { rabbitAPI(http.MethodDelete, "/api/policies/%2F/"+url.PathEscape(policy), nil) })

		name := "rabbit-" + randomSuffix()
		secret := name + "-db"
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret, Namespace: "default"},
			StringData: map[string]string{"dsn": testDSN, "uri": amqpURL}}
		Expect(k8sClient.Create(ctx, s)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, s))).To(Succeed()) })
		idc := newConsumer(name, "unused", secret)
		idc.Spec.Source = messagingv1alpha1.SourceSpec{RabbitMQ: &messagingv1alpha1.RabbitMQSource{
			URISecretRef: messagingv1alpha1.SecretKeyRef{Name: secret, Key: "uri"}, Queue: queue, ManagementURL: rabbitMgmtURL,
		}}
		create(idc)
		data := map[string]string{"dsn": testDSN, "uri": amqpURL}
		// Classic queue: L = message-ttl 1h (policy), no replay; W = 1h + 1h.
		// The management API shows a policy after its next stats refresh.
		Eventually(windowAfterNudges(name, secret, data), timeout, time.Second).Should(Equal("2h"))
		Expect(get(name).Status.Retention.DerivedFrom).To(ContainSubstring("message-ttl=1h"))
		Expect(get(name).Status.Retention.DerivedFrom).NotTo(ContainSubstring("guest:guest"))

		setTTLPolicy(policy, queue, 3*time.Hour)
		Eventually(windowAfterNudges(name, secret, data), timeout, time.Second).Should(Equal("4h"))
		Eventually(cronWindowArg(name), timeout, interval).Should(Equal("4h0m0s"))
	})
})

func setTTLPolicy(name, queue string, ttl time.Duration) {
	rabbitAPI(http.MethodPut, "/api/policies/%2F/"+url.PathEscape(name), map[string]any{
		"pattern": "^" + regexp.QuoteMeta(queue) + "$", "apply-to": "queues", "priority": 100,
		"definition": map[string]any{"message-ttl": ttl.Milliseconds()},
	})
}

func rabbitAPI(method, path string, body any) {
	var buf bytes.Buffer
	if body != nil {
		Expect(json.NewEncoder(&buf).Encode(body)).To(Succeed())
	}
	req, err := http.NewRequestWithContext(ctx, method, rabbitMgmtURL+path, strings.NewReader(buf.String()))
	Expect(err).NotTo(HaveOccurred())
	req.SetBasicAuth("guest", "guest")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	Expect(err).NotTo(HaveOccurred(), "the RabbitMQ management API must answer on :15672 (make services)")
	defer func() { _ = resp.Body.Close() }()
	Expect(resp.StatusCode).To(BeNumerically("<", 300), "%s %s", method, path)
}
