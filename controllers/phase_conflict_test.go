package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

func TestAMQPEndpointKeepsNoCredentials(t *testing.T) {
	for uri, want := range map[string]string{
		"amqp://guest:s3cret@RabbitMQ.shop:5672/":    "rabbitmq.shop:5672//",
		"amqp://u:p@rabbitmq.shop":                   "rabbitmq.shop:5672//",
		"amqps://u:p@rabbitmq.shop/orders":           "rabbitmq.shop:5671/orders",
		"amqp://u:p@rabbitmq.shop:5672/%2Fprod":      "rabbitmq.shop:5672//prod",
		" amqp://other:creds@rabbitmq.shop:5672/ \n": "rabbitmq.shop:5672//",
		"not a uri": "",
	} {
		if got := amqpEndpoint(uri); got != want {
			t.Errorf("amqpEndpoint(%q) = %q, want %q", uri, got, want)
		}
	}
}

// Two Secrets (in two namespaces) holding one RabbitMQ URI, or the same
// broker with other credentials, put two resources on one queue: the newer
// one is refused. Another virtual host is another queue.
func TestRabbitMQConsumerConflictComparesTheBrokers(t *testing.T) {
	rabbit := func(ns, name, secret string, created int64) *messagingv1alpha1.IdempotentConsumer {
		idc := unitConsumer()
		idc.Namespace, idc.Name, idc.UID = ns, name, types.UID("uid-"+ns+"-"+name)
		idc.CreationTimestamp = metav1.Unix(created, 0)
		idc.Spec.Source = messagingv1alpha1.SourceSpec{RabbitMQ: &messagingv1alpha1.RabbitMQSource{
			URISecretRef: messagingv1alpha1.SecretKeyRef{Name: secret, Key: "uri"}, Queue: "orders"}}
		idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier("inbox_" + name)
		return idc
	}
	uri := func(ns, name, v string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{"uri": []byte(v)}}
	}
	for _, tc := range []struct {
		name, otherURI string
		conflict       bool
	}{
		{"one URI in two Secrets", "amqp://app:pw@rabbitmq.shop:5672/", true},
		{"the same broker, other credentials", "amqp://audit:other@RABBITMQ.shop/", true},
		{"another virtual host", "amqp://app:pw@rabbitmq.shop:5672/audit", false},
		{"another broker", "amqp://app:pw@rabbitmq.audit:5672/", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			older := rabbit("billing", "ledger", "billing-mq", 100)
			h := newHarness(t, rabbit("shop", "orders", "shop-mq", 200), older,
				uri("shop", "shop-mq", "amqp://app:pw@rabbitmq.shop:5672/"), uri("billing", "billing-mq", tc.otherURI))
			idc, _ := h.pass()
			got := conditionOf(idc, messagingv1alpha1.ConditionStalled)
			if tc.conflict != (got == "True/"+messagingv1alpha1.ReasonConflict) {
				t.Fatalf("Stalled = %s (%v), want a Conflict: %v", got, idc.Status.Conditions, tc.conflict)
			}
		})
	}
}
