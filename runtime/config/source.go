package config

import (
	"fmt"
	"strings"
)

// Source holds exactly one broker block.
type Source struct {
	NATSJetStream *JetStream    `json:"natsJetStream,omitempty"`
	Kafka         *Kafka        `json:"kafka,omitempty"`
	RabbitMQ      *RabbitMQ     `json:"rabbitmq,omitempty"`
	RedisStreams  *RedisStreams `json:"redisStreams,omitempty"`
}

// Kind names the configured source for logs and status.
func (s Source) Kind() string {
	switch {
	case s.NATSJetStream != nil:
		return "NATSJetStream"
	case s.Kafka != nil:
		return "Kafka"
	case s.RabbitMQ != nil:
		return "RabbitMQ"
	case s.RedisStreams != nil:
		return "RedisStreams"
	}
	return ""
}

// TLS names environment variables holding PEM data.
type TLS struct {
	CAEnv              string `json:"caEnv,omitempty"`
	CertEnv            string `json:"certEnv,omitempty"`
	KeyEnv             string `json:"keyEnv,omitempty"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`
}

// JetStream is a durable pull consumer on a NATS JetStream stream.
type JetStream struct {
	URL           string `json:"url"`
	Stream        string `json:"stream"`
	Consumer      string `json:"consumer"`
	FilterSubject string `json:"filterSubject,omitempty"`
	// CredentialsEnv holds the content of a NATS .creds file.
	CredentialsEnv string `json:"credentialsEnv,omitempty"`
	TLS            *TLS   `json:"tls,omitempty"`
	// Partitions, when 2..MaxPartitions, splits the consumer into that many
	// partitions (0: one consumer). The stream partitions its subjects with
	// a subject transform whose destination holds {{partition(N,...)}}
	// (nats-server 2.10 or later); partition i is read by its own durable,
	// PartitionConsumer(Consumer, i), filtered to the partition's subjects
	// (derived from the transform, so FilterSubject must be empty). Every
	// partition writes the one inbox. The config is shared by the
	// partitions' replicas: each one learns its partition from
	// `idc-runtime run --partition=<i>` and reads ForPartition(i).
	Partitions int `json:"partitions,omitempty"`
	// PartitionIndex and OnePartition are set by ForPartition only (never
	// serialized): OnePartition says this copy is partition PartitionIndex's
	// view, whose Consumer is already that partition's durable.
	PartitionIndex int  `json:"-"`
	OnePartition   bool `json:"-"`
}

// MaxPartitions bounds JetStream.Partitions.
const MaxPartitions = 64

// PartitionConsumer names partition i's durable consumer: "<consumer>-p<i>".
func PartitionConsumer(consumer string, i int) string {
	return fmt.Sprintf("%s-p%d", consumer, i)
}

// Partitioned reports whether the config is split into partitions (as
// loaded, or a partition's view of such a config).
func (j JetStream) Partitioned() bool { return j.Partitions > 0 }

// ForPartition is partition i's view of a partitioned config: Consumer is
// the partition's durable (PartitionConsumer), PartitionIndex i and
// OnePartition true. Partitions is kept. On a view it returns the view of
// partition i of the same config.
func (j JetStream) ForPartition(i int) JetStream {
	if j.OnePartition {
		j.Consumer = strings.TrimSuffix(j.Consumer, fmt.Sprintf("-p%d", j.PartitionIndex))
	}
	j.Consumer, j.PartitionIndex, j.OnePartition = PartitionConsumer(j.Consumer, i), i, true
	return j
}

// PartitionConsumers names every partition's durable, in partition order
// (nil when the config is not partitioned).
func (j JetStream) PartitionConsumers() []string {
	base := j
	if base.OnePartition {
		base.Consumer = strings.TrimSuffix(base.Consumer, fmt.Sprintf("-p%d", base.PartitionIndex))
	}
	var out []string
	for i := 0; i < j.Partitions; i++ {
		out = append(out, PartitionConsumer(base.Consumer, i))
	}
	return out
}

// Kafka is a consumer group on one or more topics.
type Kafka struct {
	BootstrapServers []string `json:"bootstrapServers"`
	Topics           []string `json:"topics"`
	ConsumerGroup    string   `json:"consumerGroup"`
	SASL             *SASL    `json:"sasl,omitempty"`
	TLS              *TLS     `json:"tls,omitempty"`
}

// SASL authentication for Kafka.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism   string `json:"mechanism"`
	UsernameEnv string `json:"usernameEnv"`
	PasswordEnv string `json:"passwordEnv"`
}

// RabbitMQ consumes one queue.
type RabbitMQ struct {
	// URIEnv holds the amqp(s):// URI, credentials included.
	URIEnv        string `json:"uriEnv"`
	Queue         string `json:"queue"`
	Prefetch      int    `json:"prefetch,omitempty"`
	ManagementURL string `json:"managementURL,omitempty"`
	TLS           *TLS   `json:"tls,omitempty"`
}

// RedisStreams reads a stream through a consumer group.
type RedisStreams struct {
	Address     string `json:"address"`
	PasswordEnv string `json:"passwordEnv,omitempty"`
	Stream      string `json:"stream"`
	Group       string `json:"group"`
	// BodyField is the entry field holding the payload (default "body"); the
	// other fields become headers.
	BodyField string `json:"bodyField,omitempty"`
	// ClaimMinIdle: entries pending longer than this are taken over with
	// XAUTOCLAIM (the lease).
	ClaimMinIdle Duration `json:"claimMinIdle,omitempty"`
	TLS          *TLS     `json:"tls,omitempty"`
}
