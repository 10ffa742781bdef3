package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// Environment variables through which the runtime receives credentials. The
// rendered config names them; the pod spec fills them with secretKeyRef.
const (
	envPostgresDSN   = "IDC_POSTGRES_DSN"
	envMySQLDSN      = "IDC_MYSQL_DSN"
	envNATSCreds     = "IDC_NATS_CREDENTIALS"
	envKafkaUser     = "IDC_KAFKA_SASL_USERNAME"
	envKafkaPassword = "IDC_KAFKA_SASL_PASSWORD"
	envRabbitMQURI   = "IDC_RABBITMQ_URI"
	envRedisPassword = "IDC_REDIS_PASSWORD"
	envTLSCA         = "IDC_TLS_CA"
	envTLSCert       = "IDC_TLS_CERT"
	envTLSKey        = "IDC_TLS_KEY"
	envEmitNATSCreds = "IDC_EMIT_NATS_CREDENTIALS"
	envEmitTLSCA     = "IDC_EMIT_TLS_CA"
	envEmitTLSCert   = "IDC_EMIT_TLS_CERT"
	envEmitTLSKey    = "IDC_EMIT_TLS_KEY"
	envEmitKafkaUser = "IDC_EMIT_KAFKA_SASL_USERNAME"
	envEmitKafkaPass = "IDC_EMIT_KAFKA_SASL_PASSWORD"
	envEmitAMQPURI   = "IDC_EMIT_RABBITMQ_URI"
	envEmitRedisPass = "IDC_EMIT_REDIS_PASSWORD"
)

// renderedConfig is the runtime configuration and the credentials it
// needs, as the children carry them (specs.RuntimeConfig), with what the
// phases change of it after rendering (the inbox's epoch, the manager's
// http deny list).
type renderedConfig struct {
	specs.RuntimeConfig
}

// RuntimeConfigFor renders the runtime config the manager hands the child
// renderers (internal/specs) for idc, as its first pass does (the inbox
// epoch its status names, none for a new resource). The controller
// benchmark's floor renders the children the manager would apply with it.
func RuntimeConfigFor(idc *messagingv1alpha1.IdempotentConsumer) (*specs.RuntimeConfig, error) {
	rc, err := renderConfig(idc)
	if err != nil {
		return nil, err
	}
	return &rc.RuntimeConfig, nil
}

// renderConfig turns the spec into the runtime config. It is pure: the same
// resource always renders the same bytes, so the hash only moves on a change.
func renderConfig(idc *messagingv1alpha1.IdempotentConsumer) (*renderedConfig, error) {
	s := &idc.Spec
	var secrets []specs.SecretEnv
	addSecret := func(env string, ref *messagingv1alpha1.SecretKeyRef) string {
		if ref == nil {
			return ""
		}
		secrets = append(secrets, specs.SecretEnv{Env: env, Ref: *ref})
		return env
	}
	dsnRef := s.Sink.ConnectionSecretRef()
	cfg := &config.Config{
		Version:    config.Version,
		Name:       idc.Namespace + "/" + idc.Name,
		HealthAddr: fmt.Sprintf(":%d", specs.HealthPort),
		Source:     renderSource(s.Source, addSecret),
		Message:    renderMessage(s.Message),
		Sink: config.Sink{
			Kind:       sinkKind(&s.Sink),
			DSNEnv:     addSecret(sinkDSNEnv(&s.Sink), &dsnRef),
			Schema:     s.Sink.Schema(),
			InboxTable: string(s.Sink.Inbox.Table),
			Layout:     config.Layout(s.Sink.Inbox.Layout),
			Effect:     renderEffect(s),
			// The epoch the inbox phase found (or minted) last: the runtime
			// claims into that inbox only.
			InboxEpoch: statusEpoch(idc),
		},
		Delivery: config.Delivery{
			BatchSize:      int(s.Delivery.BatchSize),
			MaxWait:        dur(s.Delivery.MaxWait),
			MaxAttempts:    int(s.Delivery.MaxAttempts),
			BackoffInitial: dur(s.Delivery.Backoff.Initial),
			BackoffMax:     dur(s.Delivery.Backoff.Max),
			InFlight:       int(s.Delivery.InFlight),
			Batching:       config.Batching(s.Delivery.Batching),
			Replicas:       int(desiredReplicasDeclared(idc)),
		},
		Retention: config.Retention{
			Mode:              string(s.Retention.Mode),
			Window:            dur(s.Retention.Window),
			MaxConsumerOutage: dur(s.Retention.MaxConsumerOutage),
			SafetyMargin:      dur(s.Retention.SafetyMargin),
			MaxReplayAge:      dur(s.Retention.MaxReplayAge),
			PruneBatchSize:    int(s.Retention.Prune.BatchSize),
			PruneMaxDuration:  dur(s.Retention.Prune.MaxDuration),
		},
	}
	if s.Source.RabbitMQ != nil {
		cfg.Retention.ConsumerTimeout = dur(s.Source.RabbitMQ.ConsumerTimeout)
	}
	if s.Delivery.DeadLetter != nil {
		cfg.Sink.DeadLetterTable = string(s.Delivery.DeadLetter.Table)
	}
	cfg.Emit = renderEmit(s.Emit, addSecret)
	cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("rendering the runtime config: %w", err)
	}
	rc := &renderedConfig{specs.RuntimeConfig{Config: cfg, Secrets: secrets}}
	if err := rc.encode(); err != nil {
		return nil, err
	}
	return rc, nil
}

// withEpoch records the inbox's epoch in the config (re-encoded when it
// changed): the ConfigMap the children phase applies names it, and a new
// epoch rolls the pods.
func (rc *renderedConfig) withEpoch(epoch string) error {
	if rc.Config.Sink.InboxEpoch == epoch {
		return nil
	}
	rc.Config.Sink.InboxEpoch = epoch
	return rc.encode()
}

// encode sets JSON and Hash from Config.
func (rc *renderedConfig) encode() error {
	b, err := json.Marshal(rc.Config)
	if err != nil {
		return fmt.Errorf("encoding the runtime config: %w", err)
	}
	hash, err := configHash(rc.Config)
	if err != nil {
		return err
	}
	rc.JSON, rc.Hash = b, hash
	return nil
}

// configHash identifies the config without delivery.replicas: scaling must
// not roll the pods. New pods read the new replica count from the ConfigMap,
// and the runtime grows a broker consumer it created when they start.
func configHash(cfg *config.Config) (string, error) {
	c := *cfg
	c.Delivery.Replicas = 0
	b, err := json.Marshal(&c)
	if err != nil {
		return "", fmt.Errorf("encoding the runtime config: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8]), nil
}

// desiredReplicasDeclared is spec.runtime.replicas (1 when unset), also
// while suspended: broker limits are sized for the declared scale. Under
// autoscaling it is maxReplicas: the limits (JetStream MaxAckPending, the
// BrokerLimits condition) must hold the most replicas KEDA may run, or a
// scale-up walks into a consumer sized for fewer.
func desiredReplicasDeclared(idc *messagingv1alpha1.IdempotentConsumer) int32 {
	if a := idc.Spec.Runtime.Autoscaling; a != nil {
		return max(a.MaxReplicas, 1)
	}
	if idc.Spec.Runtime.Replicas == nil || *idc.Spec.Runtime.Replicas < 1 {
		return 1
	}
	return *idc.Spec.Runtime.Replicas
}

// sinkKind is the runtime config's sink.kind: empty for postgres, so that
// the config (and its hash) of a PostgreSQL resource is the one it had
// before MySQL existed and its pods do not roll on upgrade.
func sinkKind(s *messagingv1alpha1.SinkSpec) config.SinkKind {
	if s.Kind() == messagingv1alpha1.SinkKindMySQL {
		return config.SinkMySQL
	}
	return ""
}

// sinkDSNEnv is the environment variable the sink's DSN reaches the pods
// in: IDC_POSTGRES_DSN or IDC_MYSQL_DSN (the rendered config names it).
func sinkDSNEnv(s *messagingv1alpha1.SinkSpec) string {
	if s.Kind() == messagingv1alpha1.SinkKindMySQL {
		return envMySQLDSN
	}
	return envPostgresDSN
}

func dur(d messagingv1alpha1.Duration) config.Duration {
	v, _ := time.ParseDuration(string(d)) // the CRD schema only admits Go durations
	return config.Duration{Duration: v}
}

func renderTLS(t *messagingv1alpha1.TLSSpec, addSecret func(string, *messagingv1alpha1.SecretKeyRef) string) *config.TLS {
	return renderTLSAs(t, [3]string{envTLSCA, envTLSCert, envTLSKey}, addSecret)
}

// renderTLSAs renders a TLS block whose CA, certificate and key reach the
// pod in the env variables named by env (the emit target has its own).
func renderTLSAs(t *messagingv1alpha1.TLSSpec, env [3]string, addSecret func(string, *messagingv1alpha1.SecretKeyRef) string) *config.TLS {
	if t == nil {
		return nil
	}
	return &config.TLS{
		CAEnv:              addSecret(env[0], t.CASecretRef),
		CertEnv:            addSecret(env[1], t.CertSecretRef),
		KeyEnv:             addSecret(env[2], t.KeySecretRef),
		InsecureSkipVerify: t.InsecureSkipVerify,
	}
}

// renderEmit renders spec.emit; its credentials come from Secrets through
// env variables of their own, beside the source's.
func renderEmit(e *messagingv1alpha1.EmitSpec, addSecret func(string, *messagingv1alpha1.SecretKeyRef) string) *config.Emit {
	if e == nil {
		return nil
	}
	out := &config.Emit{When: string(e.When)}
	if len(e.Payload) > 0 {
		out.Payload = make(map[string]string, len(e.Payload))
		for k, v := range e.Payload {
			out.Payload[k] = string(v)
		}
	}
	if len(e.Headers) > 0 {
		out.Headers = make(map[string]string, len(e.Headers))
		for k, v := range e.Headers {
			out.Headers[k] = string(v)
		}
	}
	tlsEnv := [3]string{envEmitTLSCA, envEmitTLSCert, envEmitTLSKey}
	if j := e.NATSJetStream; j != nil {
		out.NATSJetStream = &config.EmitJetStream{
			URL: j.URL, Subject: j.Subject,
			CredentialsEnv: addSecret(envEmitNATSCreds, j.CredentialsSecretRef),
			TLS:            renderTLSAs(j.TLS, tlsEnv, addSecret),
		}
	}
	if k := e.Kafka; k != nil {
		out.Kafka = &config.EmitKafka{BootstrapServers: k.BootstrapServers, Topic: k.Topic, TLS: renderTLSAs(k.TLS, tlsEnv, addSecret)}
		if k.SASL != nil {
			out.Kafka.SASL = &config.SASL{
				Mechanism:   string(k.SASL.Mechanism),
				UsernameEnv: addSecret(envEmitKafkaUser, &k.SASL.UsernameSecretRef),
				PasswordEnv: addSecret(envEmitKafkaPass, &k.SASL.PasswordSecretRef),
			}
		}
	}
	if r := e.RabbitMQ; r != nil {
		out.RabbitMQ = &config.EmitRabbitMQ{URIEnv: addSecret(envEmitAMQPURI, &r.URISecretRef), Exchange: r.Exchange,
			RoutingKey: r.RoutingKey, TLS: renderTLSAs(r.TLS, tlsEnv, addSecret)}
	}
	if r := e.RedisStreams; r != nil {
		out.RedisStreams = &config.EmitRedisStreams{Address: r.Address, PasswordEnv: addSecret(envEmitRedisPass, r.PasswordSecretRef),
			Stream: r.Stream, TLS: renderTLSAs(r.TLS, tlsEnv, addSecret)}
	}
	return out
}

func renderSource(src messagingv1alpha1.SourceSpec, addSecret func(string, *messagingv1alpha1.SecretKeyRef) string) config.Source {
	var out config.Source
	if j := src.NATSJetStream; j != nil {
		out.NATSJetStream = &config.JetStream{
			URL: j.URL, Stream: j.Stream, Consumer: j.Consumer, FilterSubject: j.FilterSubject, Partitions: int(ptr.Deref(j.Partitions, 0)),
			CredentialsEnv: addSecret(envNATSCreds, j.CredentialsSecretRef),
			TLS:            renderTLS(j.TLS, addSecret),
		}
	}
	if k := src.Kafka; k != nil {
		out.Kafka = &config.Kafka{
			BootstrapServers: k.BootstrapServers, Topics: k.Topics, ConsumerGroup: k.ConsumerGroup,
			TLS: renderTLS(k.TLS, addSecret),
		}
		if k.SASL != nil {
			out.Kafka.SASL = &config.SASL{
				Mechanism:   string(k.SASL.Mechanism),
				UsernameEnv: addSecret(envKafkaUser, &k.SASL.UsernameSecretRef),
				PasswordEnv: addSecret(envKafkaPassword, &k.SASL.PasswordSecretRef),
			}
		}
	}
	if r := src.RabbitMQ; r != nil {
		out.RabbitMQ = &config.RabbitMQ{
			URIEnv: addSecret(envRabbitMQURI, &r.URISecretRef), Queue: r.Queue, ManagementURL: r.ManagementURL,
			TLS: renderTLS(r.TLS, addSecret),
		}
		if r.Prefetch != nil {
			out.RabbitMQ.Prefetch = int(*r.Prefetch)
		}
	}
	if r := src.RedisStreams; r != nil {
		out.RedisStreams = &config.RedisStreams{
			Address: r.Address, PasswordEnv: addSecret(envRedisPassword, r.PasswordSecretRef),
			Stream: r.Stream, Group: r.Group, BodyField: r.BodyField, ClaimMinIdle: dur(r.ClaimMinIdle),
			TLS: renderTLS(r.TLS, addSecret),
		}
	}
	return out
}

func renderMessage(m messagingv1alpha1.MessageSpec) config.Message {
	out := config.Message{ID: config.Extractor{Header: m.ID.Header, JSONPath: string(m.ID.JSONPath), BrokerNative: m.ID.BrokerNative},
		OnPayloadMismatch: string(m.ID.OnPayloadMismatch)}
	if e := m.Entity; e != nil {
		out.Entity = &config.Entity{
			Key:      config.Extractor{Header: e.Key.Header, JSONPath: string(e.Key.JSONPath)},
			Sequence: config.Extractor{Header: e.Sequence.Header, JSONPath: string(e.Sequence.JSONPath)},
		}
	}
	return out
}

func columns(c messagingv1alpha1.Columns) map[string]string {
	out := make(map[string]string, len(c))
	for k, v := range c {
		out[k] = string(v)
	}
	return out
}

func renderEffect(s *messagingv1alpha1.IdempotentConsumerSpec) config.Effect {
	e := s.Sink.Effect
	var out config.Effect
	if u := e.Upsert; u != nil {
		keys := make([]string, len(u.Key))
		for i, k := range u.Key {
			keys[i] = string(k)
		}
		out.Upsert = &config.Upsert{Table: string(u.Table), Key: keys, Columns: columns(u.Columns), SequenceColumn: sequenceColumn(u, s.Message.Entity)}
	}
	if a := e.Append; a != nil {
		out.Append = &config.Append{Table: string(a.Table), Columns: columns(a.Columns)}
	}
	if q := e.SQL; q != nil {
		params := make(map[string]string, len(q.Params))
		for k, v := range q.Params {
			params[k] = string(v)
		}
		out.SQL = &config.SQL{Statement: q.Statement, Params: params}
	}
	if h := e.HTTP; h != nil {
		out.HTTP = &config.HTTP{URL: h.URL, Method: string(h.Method), Timeout: dur(h.Timeout), Delivery: string(h.Delivery)}
	}
	return out
}

// sequenceColumn is the explicit sequenceColumn, else the column whose value
// expression is the entity's sequence JSON path (sorted, so the choice is
// stable).
func sequenceColumn(u *messagingv1alpha1.UpsertEffect, entity *messagingv1alpha1.EntitySpec) string {
	if u.SequenceColumn != "" {
		return string(u.SequenceColumn)
	}
	if entity == nil || entity.Sequence.JSONPath == "" {
		return ""
	}
	names := make([]string, 0, len(u.Columns))
	for k := range u.Columns {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if string(u.Columns[k]) == string(entity.Sequence.JSONPath) {
			return k
		}
	}
	return ""
}

// withHTTPDenyNetworks puts the manager's deny list into an http effect's
// config (re-encoding it and its hash); other effects are left as they are.
func (rc *renderedConfig) withHTTPDenyNetworks(nets []string) error {
	h := rc.Config.Sink.Effect.HTTP
	if h == nil || len(nets) == 0 {
		return nil
	}
	h.DenyNetworks = append([]string(nil), nets...)
	if err := rc.Config.Validate(); err != nil {
		return fmt.Errorf("rendering the runtime config: %w", err)
	}
	return rc.encode()
}
