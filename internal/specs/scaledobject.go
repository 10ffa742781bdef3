package specs

import (
	"cmp"
	"fmt"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// KEDA's API: the ScaledObject and TriggerAuthentication the controller
// renders (keda.sh/v1alpha1, KEDA v2).
var (
	GVKScaledObject          = schema.GroupVersionKind{Group: "keda.sh", Version: "v1alpha1", Kind: "ScaledObject"}
	GVKTriggerAuthentication = schema.GroupVersionKind{Group: "keda.sh", Version: "v1alpha1", Kind: "TriggerAuthentication"}
)

// natsMonitoringPort is the NATS server's default monitoring port.
const natsMonitoringPort = "8222"

// LagPerReplica is the backlog per replica KEDA scales on: the declared
// one, else one fetch of one replica (batchSize x inFlight).
func LagPerReplica(idc *messagingv1alpha1.IdempotentConsumer, rc *RuntimeConfig) int64 {
	if a := idc.Spec.Runtime.Autoscaling; a != nil && a.LagPerReplica != nil {
		return *a.LagPerReplica
	}
	return int64(rc.Config.Delivery.MinUnacked(1))
}

// secondsOr is a Go duration in whole seconds, rounded up (KEDA and the
// HPA take seconds); def (the CRD's default) when it is empty, as in a
// resource the API server did not default.
func secondsOr(d messagingv1alpha1.Duration, def int64) int64 {
	if d == "" {
		return def
	}
	v, err := time.ParseDuration(string(d))
	if err != nil || v <= 0 {
		return 0
	}
	return int64(math.Ceil(v.Seconds()))
}

// kedaTrigger is one KEDA trigger: its type, metadata and the parameters
// that come from Secrets (parameter -> the source's own Secret key).
type kedaTrigger struct {
	typ      string
	metadata map[string]string
	secrets  []kedaSecretParam
}

type kedaSecretParam struct {
	parameter string
	ref       messagingv1alpha1.SecretKeyRef
}

// renderKEDATrigger builds the scaler that matches the source kind from the
// same source spec the runtime consumes with. Pure.
func renderKEDATrigger(idc *messagingv1alpha1.IdempotentConsumer, rc *RuntimeConfig, w Workload) (kedaTrigger, error) {
	a := idc.Spec.Runtime.Autoscaling
	lag := strconv.FormatInt(LagPerReplica(idc, rc), 10)
	activation := strconv.FormatInt(a.ActivationLag, 10)
	src := idc.Spec.Source
	var t kedaTrigger
	addTLS := func(tls *messagingv1alpha1.TLSSpec) {
		if tls == nil {
			return
		}
		for _, p := range []struct {
			param string
			ref   *messagingv1alpha1.SecretKeyRef
		}{{"ca", tls.CASecretRef}, {"cert", tls.CertSecretRef}, {"key", tls.KeySecretRef}} {
			if p.ref != nil {
				t.secrets = append(t.secrets, kedaSecretParam{p.param, *p.ref})
			}
		}
		if tls.InsecureSkipVerify {
			t.metadata["unsafeSsl"] = "true"
		}
	}
	switch {
	case src.NATSJetStream != nil:
		j := src.NATSJetStream
		endpoint, https, err := natsMonitoring(a, j)
		if err != nil {
			return t, err
		}
		t = kedaTrigger{typ: "nats-jetstream", metadata: map[string]string{
			"natsServerMonitoringEndpoint": endpoint, "useHttps": strconv.FormatBool(https), "account": cmp.Or(a.NATSAccount, "$G"),
			"stream": j.Stream, "consumer": cmp.Or(w.Consumer, j.Consumer), "lagThreshold": lag, "activationLagThreshold": activation,
		}}
	case src.Kafka != nil:
		k := src.Kafka
		t = kedaTrigger{typ: "kafka", metadata: map[string]string{
			"bootstrapServers": strings.Join(k.BootstrapServers, ","), "consumerGroup": k.ConsumerGroup,
			// The runtime starts a new group at the earliest offset: so
			// does KEDA's count of its lag.
			"offsetResetPolicy": "earliest", "lagThreshold": lag, "activationLagThreshold": activation,
		}}
		if len(k.Topics) == 1 {
			t.metadata["topic"] = k.Topics[0]
		}
		if k.SASL != nil {
			t.metadata["sasl"] = map[messagingv1alpha1.KafkaSASLMechanism]string{"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256", "SCRAM-SHA-512": "scram_sha512"}[k.SASL.Mechanism]
			t.secrets = append(t.secrets, kedaSecretParam{"username", k.SASL.UsernameSecretRef}, kedaSecretParam{"password", k.SASL.PasswordSecretRef})
		}
		if k.TLS != nil {
			t.metadata["tls"] = "enable"
			addTLS(k.TLS)
		}
	case src.RabbitMQ != nil:
		r := src.RabbitMQ
		t = kedaTrigger{typ: "rabbitmq", metadata: map[string]string{
			"protocol": "amqp", "queueName": r.Queue, "mode": "QueueLength", "value": lag, "activationValue": activation,
		}, secrets: []kedaSecretParam{{"host", r.URISecretRef}}}
		if r.TLS != nil {
			if r.TLS.CASecretRef != nil || r.TLS.CertSecretRef != nil {
				return t, fmt.Errorf("spec.source.rabbitmq.tls with a CA or client certificate cannot be given to KEDA's rabbitmq scaler (it takes tls=enable only from a Secret); use an amqps:// URI whose server certificate the system roots verify, or scale by spec.runtime.replicas")
			}
			addTLS(r.TLS)
		}
	case src.RedisStreams != nil:
		r := src.RedisStreams
		t = kedaTrigger{typ: "redis-streams", metadata: map[string]string{
			"address": r.Address, "stream": r.Stream, "consumerGroup": r.Group, "lagCount": lag, "activationLagCount": activation,
		}}
		if r.PasswordSecretRef != nil {
			t.secrets = append(t.secrets, kedaSecretParam{"password", *r.PasswordSecretRef})
		}
		if r.TLS != nil {
			t.metadata["enableTLS"] = "true"
			addTLS(r.TLS)
		}
	default:
		return t, fmt.Errorf("no source to scale on")
	}
	return t, nil
}

// natsMonitoring is the NATS monitoring endpoint (host:port) and whether it
// speaks https: the declared URL, else the source URL's host on 8222.
func natsMonitoring(a *messagingv1alpha1.AutoscalingSpec, j *messagingv1alpha1.NATSJetStreamSource) (string, bool, error) {
	if a.NATSMonitoringURL != "" {
		u, err := url.Parse(a.NATSMonitoringURL)
		if err != nil || u.Host == "" {
			return "", false, fmt.Errorf("spec.runtime.autoscaling.natsMonitoringURL %q is not http(s)://host[:port]", a.NATSMonitoringURL)
		}
		return u.Host, u.Scheme == "https", nil
	}
	first := strings.TrimSpace(strings.Split(j.URL, ",")[0])
	u, err := url.Parse(first)
	if err != nil || u.Hostname() == "" {
		return "", false, fmt.Errorf("spec.source.natsJetStream.url %q names no host to derive the monitoring endpoint from; set spec.runtime.autoscaling.natsMonitoringURL", j.URL)
	}
	return net.JoinHostPort(u.Hostname(), natsMonitoringPort), u.Scheme == "tls" || u.Scheme == "wss" || j.TLS != nil, nil
}

// ScaleHold is what the controller knows that KEDA's scaler does not.
type ScaleHold struct {
	// Paused holds the Deployment at 0 (suspend, or a sink that cannot
	// take the effect yet).
	Paused bool
	// AwaitConsumer raises minReplicas 0 to 1 while the broker has no
	// consumer for the scaler to read: the runtime creates it on its first
	// start, and KEDA (initialCooldownPeriod 0) would otherwise scale a new
	// Deployment to 0 at its first poll, before any pod created it, and
	// nothing would ever wake it.
	AwaitConsumer bool
}

// MinReplicas is the minReplicaCount the ScaledObject gets under h.
func (h ScaleHold) MinReplicas(a *messagingv1alpha1.AutoscalingSpec) int32 {
	if h.AwaitConsumer {
		return max(a.MinReplicasOrDefault(), 1)
	}
	return a.MinReplicasOrDefault()
}

// ScaledObject renders the KEDA ScaledObject that scales a consumer
// workload's Deployment on its own consumer's lag (each partition on its
// own), and the TriggerAuthentication it references (nil when the scaler
// needs no Secret; one for all workloads), under hold. Pure.
func ScaledObject(idc *messagingv1alpha1.IdempotentConsumer, rc *RuntimeConfig, hold ScaleHold, w Workload) (*unstructured.Unstructured, *unstructured.Unstructured, error) {
	a := idc.Spec.Runtime.Autoscaling
	t, err := renderKEDATrigger(idc, rc, w)
	if err != nil {
		return nil, nil, err
	}
	labels := anyMap(w.labels(idc))
	metadata := map[string]any{}
	for k, v := range t.metadata {
		metadata[k] = v
	}
	trigger := map[string]any{"type": t.typ, "metadata": metadata}

	var ta *unstructured.Unstructured
	if len(t.secrets) > 0 {
		refs := make([]any, 0, len(t.secrets))
		for _, s := range t.secrets {
			refs = append(refs, map[string]any{"parameter": s.parameter, "name": s.ref.Name, "key": s.ref.Key})
		}
		ta = &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": TriggerAuthName(idc), "namespace": idc.Namespace, "labels": anyMap(Labels(idc, ComponentConsumer))},
			"spec":     map[string]any{"secretTargetRef": refs},
		}}
		ta.SetGroupVersionKind(GVKTriggerAuthentication)
		trigger["authenticationRef"] = map[string]any{"name": TriggerAuthName(idc)}
	}

	so := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": w.Name, "namespace": idc.Namespace, "labels": labels},
		"spec": map[string]any{
			"scaleTargetRef":  map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "name": w.Name},
			"minReplicaCount": int64(hold.MinReplicas(a)),
			"maxReplicaCount": int64(a.MaxReplicas),
			"pollingInterval": secondsOr(a.PollingInterval, 30),
			"cooldownPeriod":  secondsOr(a.CooldownPeriod, 300),
			"advanced": map[string]any{"horizontalPodAutoscalerConfig": map[string]any{"behavior": map[string]any{
				"scaleDown": map[string]any{"stabilizationWindowSeconds": secondsOr(a.ScaleDownStabilization, 300)},
			}}},
			"triggers": []any{trigger},
		},
	}}
	so.SetGroupVersionKind(GVKScaledObject)
	if hold.Paused {
		// KEDA scales the target to this count and stops scaling it.
		so.SetAnnotations(map[string]string{"autoscaling.keda.sh/paused-replicas": "0"})
	}
	return so, ta, nil
}

func anyMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
