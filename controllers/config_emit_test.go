package controllers

import (
	"strings"
	"testing"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// spec.emit reaches the runtime config; its NATS credentials and TLS
// material reach the pod only as secretKeyRef env variables of their own
// (never the source's), and no credential value is in the config.
func TestRenderEmitPassesCredentialsAsSecretEnv(t *testing.T) {
	idc := newConsumer("orders", "ORDERS", "orders-db")
	idc.Spec.Emit = &messagingv1alpha1.EmitSpec{
		NATSJetStream: &messagingv1alpha1.NATSJetStreamEmit{URL: "nats://out:4222", Subject: "order-projected",
			CredentialsSecretRef: &messagingv1alpha1.SecretKeyRef{Name: "nats-publisher", Key: "creds"},
			TLS:                  &messagingv1alpha1.TLSSpec{CASecretRef: &messagingv1alpha1.SecretKeyRef{Name: "nats-ca", Key: "ca.crt"}}},
		Payload: map[string]messagingv1alpha1.ValueExpression{"orderId": "$.orderId"},
		When:    messagingv1alpha1.EmitChanged,
	}
	rc, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	e := rc.Config.Emit
	if e == nil || e.NATSJetStream == nil || e.NATSJetStream.Subject != "order-projected" || e.When != config.EmitChanged || e.Payload["orderId"] != "$.orderId" {
		t.Fatalf("emit not rendered: %+v", e)
	}
	if e.NATSJetStream.CredentialsEnv != envEmitNATSCreds || e.NATSJetStream.TLS.CAEnv != envEmitTLSCA {
		t.Errorf("emit env names %q / %q, want %q / %q", e.NATSJetStream.CredentialsEnv, e.NATSJetStream.TLS.CAEnv, envEmitNATSCreds, envEmitTLSCA)
	}
	env := map[string]string{}
	for _, v := range specs.Deployment(idc, &rc.RuntimeConfig, "idc-runtime", "", specs.Workloads(idc)[0]).Spec.Template.Spec.Containers[0].Env {
		if v.Name == "POD_NAME" {
			continue
		}
		if v.ValueFrom == nil || v.ValueFrom.SecretKeyRef == nil || v.Value != "" {
			t.Fatalf("env %s is not a secretKeyRef: %+v", v.Name, v)
		}
		env[v.Name] = v.ValueFrom.SecretKeyRef.Name + "/" + v.ValueFrom.SecretKeyRef.Key
	}
	if env[envEmitNATSCreds] != "nats-publisher/creds" || env[envEmitTLSCA] != "nats-ca/ca.crt" {
		t.Errorf("secret env = %v, want the emit creds and CA from their Secrets", env)
	}
	if strings.Contains(string(rc.JSON), "nats-publisher") {
		t.Errorf("the config names the Secret instead of the env variable: %s", rc.JSON)
	}

	idc.Spec.Emit.When = ""
	rc, err = renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Config.Emit.When != config.EmitAlways {
		t.Errorf("when defaulted to %q, want Always", rc.Config.Emit.When)
	}
}

func TestRenderEmitTargetsSecretEnv(t *testing.T) {
	ref := func(name string) *messagingv1alpha1.SecretKeyRef {
		return &messagingv1alpha1.SecretKeyRef{Name: name, Key: "k"}
	}
	cases := map[string]struct {
		emit messagingv1alpha1.EmitSpec
		env  map[string]string
	}{
		"kafka": {messagingv1alpha1.EmitSpec{Kafka: &messagingv1alpha1.KafkaEmit{BootstrapServers: []string{"k:9092"}, Topic: "t",
			SASL: &messagingv1alpha1.KafkaSASL{Mechanism: "PLAIN", UsernameSecretRef: *ref("ku"), PasswordSecretRef: *ref("kp")}}},
			map[string]string{envEmitKafkaUser: "ku", envEmitKafkaPass: "kp"}},
		"rabbitmq": {messagingv1alpha1.EmitSpec{RabbitMQ: &messagingv1alpha1.RabbitMQEmit{URISecretRef: *ref("amqp"), RoutingKey: "q"}},
			map[string]string{envEmitAMQPURI: "amqp"}},
		"redisStreams": {messagingv1alpha1.EmitSpec{RedisStreams: &messagingv1alpha1.RedisStreamsEmit{Address: "r:6379", Stream: "s", PasswordSecretRef: ref("redis")}},
			map[string]string{envEmitRedisPass: "redis"}},
	}
	for name, tc := range cases {
		idc := newConsumer("orders", "ORDERS", "orders-db")
		idc.Spec.Emit = &tc.emit
		rc, err := renderConfig(idc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !strings.HasPrefix(rc.Config.Emit.Target(), name+":") {
			t.Errorf("%s: target %q", name, rc.Config.Emit.Target())
		}
		got := map[string]string{}
		for _, s := range rc.Secrets {
			got[s.Env] = s.Ref.Name
		}
		for env, secret := range tc.env {
			if got[env] != secret {
				t.Errorf("%s: env %s from Secret %q, want %q (all: %v)", name, env, got[env], secret, got)
			}
		}
	}
}
