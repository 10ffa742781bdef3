package v1alpha1

// SourceSpec is the broker to consume from. Exactly one block is set.
// +kubebuilder:validation:XValidation:rule="[has(self.natsJetStream), has(self.kafka), has(self.rabbitmq), has(self.redisStreams)].filter(x, x).size() == 1",message="exactly one of natsJetStream, kafka, rabbitmq, redisStreams must be set"
type SourceSpec struct {
	// natsJetStream consumes a JetStream stream through a durable pull consumer.
	// +optional
	NATSJetStream *NATSJetStreamSource `json:"natsJetStream,omitempty"`
	// kafka consumes topics through a consumer group.
	// +optional
	Kafka *KafkaSource `json:"kafka,omitempty"`
	// rabbitmq consumes one queue.
	// +optional
	RabbitMQ *RabbitMQSource `json:"rabbitmq,omitempty"`
	// redisStreams consumes a stream through a consumer group.
	// +optional
	RedisStreams *RedisStreamsSource `json:"redisStreams,omitempty"`
}

// NATSJetStreamSource is a durable pull consumer on a JetStream stream.
// +kubebuilder:validation:XValidation:rule="!has(self.partitions) || !has(self.filterSubject)",message="filterSubject cannot be set with partitions: each partition's consumer is filtered to its partition's subjects, derived from the stream's partition transform"
// +kubebuilder:validation:XValidation:rule="has(self.partitions) == has(oldSelf.partitions)",message="partitions cannot be added or removed: the partitions' durable consumers and the unpartitioned one are different consumers"
type NATSJetStreamSource struct {
	// url of the NATS server, e.g. nats://nats:4222.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^(nats|tls|ws|wss)://.+')",message="url must start with nats://, tls://, ws:// or wss://"
	// +kubebuilder:validation:XValidation:rule="!self.matches('(^|,)[ ]*[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#,]*@')",message="url must not carry credentials (user info); use credentialsSecretRef"
	// +required
	URL string `json:"url"`
	// stream name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[^.*>\s]+$`
	// +required
	Stream string `json:"stream"`
	// consumer is the durable consumer name. Immutable: a new name would start
	// a new consumer from the stream's deliver policy.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[^.*>\s]+$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="consumer is immutable"
	// +required
	Consumer string `json:"consumer"`
	// filterSubject restricts the consumer to matching subjects.
	// +kubebuilder:validation:MaxLength=255
	// +optional
	FilterSubject string `json:"filterSubject,omitempty"`
	// partitions splits the consumer by the stream's subject partitions:
	// the stream must partition its subjects with a subject transform
	// whose destination holds {{partition(N,...)}} with this N (nats-server
	// 2.10+). Partition i runs its own Deployment <name>-p<i>, reading its
	// own durable <consumer>-p<i> filtered to that partition's subjects, so
	// one key is handled by one partition; all partitions share the one
	// inbox. spec.runtime.replicas (or autoscaling) applies per partition.
	// Immutable.
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=64
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="partitions is immutable: another count is another set of durable consumers"
	// +optional
	Partitions *int32 `json:"partitions,omitempty"`
	// credentialsSecretRef holds a NATS .creds file.
	// +optional
	CredentialsSecretRef *SecretKeyRef `json:"credentialsSecretRef,omitempty"`
	// tls towards the server.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
}

// KafkaSASLMechanism is a SASL mechanism.
// +kubebuilder:validation:Enum=PLAIN;SCRAM-SHA-256;SCRAM-SHA-512
type KafkaSASLMechanism string

// KafkaSASL authenticates with SASL.
type KafkaSASL struct {
	// mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	// +required
	Mechanism KafkaSASLMechanism `json:"mechanism"`
	// usernameSecretRef holds the user name.
	// +required
	UsernameSecretRef SecretKeyRef `json:"usernameSecretRef"`
	// passwordSecretRef holds the password.
	// +required
	PasswordSecretRef SecretKeyRef `json:"passwordSecretRef"`
}

// KafkaSource consumes topics through a consumer group. Offsets are committed
// only after the database transaction commits.
type KafkaSource struct {
	// bootstrapServers are host:port pairs.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=255
	// +kubebuilder:validation:items:Pattern=`^[^\s:]+:[0-9]{1,5}$`
	// +required
	BootstrapServers []string `json:"bootstrapServers"`
	// topics to consume.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=249
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z0-9._-]+$`
	// +required
	Topics []string `json:"topics"`
	// consumerGroup id. Immutable: a new group starts from its reset policy.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="consumerGroup is immutable"
	// +required
	ConsumerGroup string `json:"consumerGroup"`
	// sasl authentication.
	// +optional
	SASL *KafkaSASL `json:"sasl,omitempty"`
	// tls towards the brokers.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
}

// RabbitMQSource consumes one queue with manual acknowledgements.
type RabbitMQSource struct {
	// uriSecretRef holds the amqp:// or amqps:// URI, credentials included.
	// +required
	URISecretRef SecretKeyRef `json:"uriSecretRef"`
	// queue to consume. It must exist; the operator does not declare it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +required
	Queue string `json:"queue"`
	// prefetch is the channel QoS (per replica). Defaults to
	// 4 x delivery.batchSize x delivery.inFlight (at most 65535); a smaller
	// value than batchSize x inFlight is reported in the BrokerLimits
	// condition.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Prefetch *int32 `json:"prefetch,omitempty"`
	// managementURL of the management HTTP API (http://host:15672), read to
	// derive retention from queue arguments and policies. Its credentials are
	// taken from the AMQP URI.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^https?://.+')",message="managementURL must be an http:// or https:// URL"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@')",message="managementURL must not carry credentials (user info); they are taken from the AMQP URI Secret"
	// +optional
	ManagementURL string `json:"managementURL,omitempty"`
	// consumerTimeout is the broker's consumer_timeout (the lease of an
	// unacknowledged delivery), declared because the management API of
	// RabbitMQ 3.x does not expose it. Defaults to RabbitMQ's 30m; a queue's
	// x-consumer-timeout argument or policy wins over it.
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="consumerTimeout must be positive"
	// +optional
	ConsumerTimeout Duration `json:"consumerTimeout,omitempty"`
	// tls towards the broker.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
}

// RedisStreamsSource consumes a stream through a consumer group.
type RedisStreamsSource struct {
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
	// group is the consumer group. Immutable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="group is immutable"
	// +required
	Group string `json:"group"`
	// bodyField is the entry field holding the payload; other fields become headers.
	// +kubebuilder:default=body
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +optional
	BodyField string `json:"bodyField,omitempty"`
	// claimMinIdle is the lease: entries pending longer are claimed by another
	// consumer with XAUTOCLAIM.
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="claimMinIdle must be positive"
	// +optional
	ClaimMinIdle Duration `json:"claimMinIdle,omitempty"`
	// tls towards the server.
	// +optional
	TLS *TLSSpec `json:"tls,omitempty"`
}

// IDSpec says where a message's dedup id is. Exactly one field is set.
// +kubebuilder:validation:XValidation:rule="[has(self.header), has(self.jsonPath), has(self.brokerNative) && self.brokerNative].filter(x, x).size() == 1",message="exactly one of header, jsonPath, brokerNative: true must be set"
type IDSpec struct {
	// header holding the id, e.g. Nats-Msg-Id or message_id.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +optional
	Header string `json:"header,omitempty"`
	// jsonPath into the payload, e.g. $.eventId.
	// +optional
	JSONPath JSONPath `json:"jsonPath,omitempty"`
	// brokerNative uses the broker's id of the stored record (JetStream stream
	// sequence, Kafka topic/partition/offset, RabbitMQ message_id property,
	// Redis entry id). Pitfall: a producer that re-sends gets a new native id,
	// so only broker-side redeliveries are deduplicated.
	// +optional
	BrokerNative bool `json:"brokerNative,omitempty"`
	// onPayloadMismatch is what happens to a duplicate id whose payload
	// differs from the one claimed first (its fingerprint, the first 8 bytes
	// of SHA-256 of the payload, differs): a producer reusing an id for a
	// different event. Record (default) keeps a row in <inbox>_id_conflicts;
	// DeadLetter sets the message aside; Ignore only counts it. Every case
	// counts in idc_id_conflicts_total; the effect is never applied twice.
	// +kubebuilder:default=Record
	// +optional
	OnPayloadMismatch PayloadMismatchPolicy `json:"onPayloadMismatch,omitempty"`
}

// PayloadMismatchPolicy is what a duplicate id with a different payload does.
// +kubebuilder:validation:Enum=Record;DeadLetter;Ignore
type PayloadMismatchPolicy string

// FieldSpec says where a value is: a header or a JSON path. Exactly one is set.
// +kubebuilder:validation:XValidation:rule="has(self.header) != has(self.jsonPath)",message="exactly one of header, jsonPath must be set"
type FieldSpec struct {
	// header holding the value.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +optional
	Header string `json:"header,omitempty"`
	// jsonPath into the payload.
	// +optional
	JSONPath JSONPath `json:"jsonPath,omitempty"`
}

// EntitySpec turns on the sequence gate: state for a key only moves forward.
type EntitySpec struct {
	// key identifies the entity, e.g. $.orderId.
	// +required
	Key FieldSpec `json:"key"`
	// sequence is an integer that grows with every change of the entity.
	// +required
	Sequence FieldSpec `json:"sequence"`
}

// MessageSpec describes the messages.
type MessageSpec struct {
	// id is the dedup key. It must be minted when the event is created, not
	// per delivery: an id re-minted on every send dedupes nothing.
	// +required
	ID IDSpec `json:"id"`
	// entity, when set, turns on the sequence gate for upserts.
	// +optional
	Entity *EntitySpec `json:"entity,omitempty"`
}
