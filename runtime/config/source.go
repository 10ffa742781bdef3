package config

import "fmt"

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
	// Partitions is natsJetStream.partitions (0: unpartitioned): each
	// partition's replicas run with --partition and read the durable
	// PartitionConsumer(Consumer, i).
	Partitions int `json:"partitions,omitempty"`
	// CredentialsEnv holds the content of a NATS .creds file.
	CredentialsEnv string `json:"credentialsEnv,omitempty"`
	TLS            *TLS   `json:"tls,omitempty"`
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

// PartitionConsumer is the durable consumer of partition i of a
// partitioned JetStream source (natsJetStream.partitions).
func PartitionConsumer(consumer string, i int) string {
	return fmt.Sprintf("%s-p%d", consumer, i)
}
