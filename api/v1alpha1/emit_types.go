package v1alpha1

// EmitSpec is the transactional outbox: for every new message an event is
// written to <inbox>_outbox in the same transaction as the claim and the
// effect, and the runtime's relay publishes it at least once with a stable
// derived id (the first 32 hex digits of SHA-256(message id + NUL + target),
// target being "natsJetStream:<subject>", "kafka:<topic>",
// "rabbitmq:<exchange>/<routingKey>" or "redisStreams:<stream>"), set as the
// broker's dedup key where it has one and always as the Idc-Event-Id header
// (a field on Redis). A
// downstream IdempotentConsumer dedupes on it (message.id.header:
// Nats-Msg-Id), so a chain of consumers is exactly-once end to end.
// +kubebuilder:validation:XValidation:rule="[has(self.natsJetStream), has(self.kafka), has(self.rabbitmq), has(self.redisStreams)].filter(x, x).size() == 1",message="exactly one emit target must be set: natsJetStream, kafka, rabbitmq, redisStreams"
type EmitSpec struct {
	// natsJetStream publishes to a subject that a JetStream stream captures.
	// +optional
	NATSJetStream *NATSJetStreamEmit `json:"natsJetStream,omitempty"`
	// kafka produces to a topic with the idempotent producer.
	// +optional
	Kafka *KafkaEmit `json:"kafka,omitempty"`
	// rabbitmq publishes to an exchange (message-id = the event id),
	// mandatory and with publisher confirms.
	// +optional
	RabbitMQ *RabbitMQEmit `json:"rabbitmq,omitempty"`
	// redisStreams appends to a stream (XADD).
	// +optional
	RedisStreams *RedisStreamsEmit `json:"redisStreams,omitempty"`
	// payload maps output field names to value expressions (the same
	// expressions as effect columns). Default: the incoming payload as it is.
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, size(k) > 0 && size(k) <= 255)",message="payload field names must be 1 to 255 characters"
	// +optional
	Payload map[string]ValueExpression `json:"payload,omitempty"`
	// headers maps header names to value expressions, sent with every
	// event besides Idc-Event-Id (JetStream and Kafka headers, RabbitMQ
	// message headers, Redis entry fields).
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[A-Za-z0-9_.-]{1,255}$'))",message="header names must be 1 to 255 letters, digits, '-', '_' or '.'"
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.lowerAscii() != 'idc-event-id' && !k.lowerAscii().startsWith('nats-'))",message="Idc-Event-Id and Nats-* headers are set by the runtime"
	// +optional
	Headers map[string]ValueExpression `json:"headers,omitempty"`
	// when decides which new messages emit. Always: every new message whose
	// effect was applied. Changed: for upsert, only messages the sequence
	// gate let through (a stale or superseded update emits nothing); for
	// append and sql every applied message changes state, so Changed is the
	// same as Always there.
	// +kubebuilder:default=Always
	// +optional
	When EmitWhen `json:"when,omitempty"`
}

// EmitWhen is when a new message emits its event.
// +kubebuilder:validation:Enum=Always;Changed
type EmitWhen string

// Values of EmitWhen.
const (
	EmitAlways  EmitWhen = "Always"
	EmitChanged EmitWhen = "Changed"
)

// NATSJetStreamEmit is the JetStream subject events are published to, with
// Nats-Msg-Id = the derived event id.
type NATSJetStreamEmit struct {
	// url of the NATS server, e.g. nats://nats:4222.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^(nats|tls|ws|wss)://.+')",message="url must start with nats://, tls://, ws:// or wss://"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|,)[ ]*[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#,]*@')",message="url must not carry credentials (user info); use credentialsSecretRef"
	// +required
	URL string `json:"url"`
	// subject to publish to; no wildcards. A stream must capture it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[^.*>\s]+(\.[^.*>\s]+)*$`
	// +required
	Subject string `json:"subject"`
	// credentialsSecretRef holds a NATS .creds file.
	// +optional
	CredentialsSecretRef *SecretKeyRef `json:"credentialsSecretRef,omitempty"`
	// tls towards the server.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
}

// KafkaEmit is a topic written by the idempotent producer; the record key is
// the outbox shard, so one entity key stays in one partition, in order.
type KafkaEmit struct {
	// bootstrapServers are host:port pairs.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=255
	// +kubebuilder:validation:items:Pattern=`^[^\s:]+:[0-9]{1,5}$`
	// +required
	BootstrapServers []string `json:"bootstrapServers"`
	// topic to produce to.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=249
	// +kubebuilder:validation:Pattern=`^[a-zA-Z0-9._-]+$`
	// +required
	Topic string `json:"topic"`
	// sasl authentication.
	// +optional
	SASL *KafkaSASL `json:"sasl,omitempty"`
	// tls towards the brokers.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
}

// RabbitMQEmit is an exchange and routing key.
// +kubebuilder:validation:XValidation:rule="(has(self.exchange) && size(self.exchange) > 0) || (has(self.routingKey) && size(self.routingKey) > 0)",message="routingKey is required with the default exchange (it names the queue)",fieldPath=".routingKey"
type RabbitMQEmit struct {
	// uriSecretRef holds the amqp:// or amqps:// URI, credentials included.
	// +required
	URISecretRef SecretKeyRef `json:"uriSecretRef"`
	// exchange to publish to; empty is the default exchange, which routes
	// to the queue named by routingKey.
	// +kubebuilder:validation:MaxLength=255
	// +optional
	Exchange string `json:"exchange,omitempty"`
	// routingKey of every event.
	// +kubebuilder:validation:MaxLength=255
	// +optional
	RoutingKey string `json:"routingKey,omitempty"`
	// tls towards the broker.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
}

// RedisStreamsEmit is a stream; each entry holds the payload in "body" and
// the event id in "Idc-Event-Id".
type RedisStreamsEmit struct {
	// address is host:port of the Redis server.
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[^\s:]+:[0-9]{1,5}$`
	// +required
	Address string `json:"address"`
	// passwordSecretRef holds the Redis password.
	// +optional
	PasswordSecretRef *SecretKeyRef `json:"passwordSecretRef,omitempty"`
	// stream key.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +required
	Stream string `json:"stream"`
	// tls towards the server.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
}
