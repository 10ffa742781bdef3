package config

import "strings"

// Emit is the transactional outbox of a consumer: for every new message an
// event is written to <inbox>_outbox in the same transaction as the claim
// and the effect, and the relay publishes it to the target.
type Emit struct {
	// Exactly one target is set.
	NATSJetStream *EmitJetStream    `json:"natsJetStream,omitempty"`
	Kafka         *EmitKafka        `json:"kafka,omitempty"`
	RabbitMQ      *EmitRabbitMQ     `json:"rabbitmq,omitempty"`
	RedisStreams  *EmitRedisStreams `json:"redisStreams,omitempty"`
	// Payload maps output field names to value expressions (as columns);
	// empty means the incoming payload, unchanged.
	Payload map[string]string `json:"payload,omitempty"`
	// Headers maps header names to value expressions, sent with every event
	// (on Redis as entry fields) besides Idc-Event-Id.
	Headers map[string]string `json:"headers,omitempty"`
	// When is Always (every new message) or Changed (only messages whose
	// effect changed state; see docs/operate.md, Pipelines).
	When string `json:"when,omitempty"`
}

// Values of Emit.When.
const (
	EmitAlways  = "Always"
	EmitChanged = "Changed"
)

// EmitJetStream is a JetStream subject to publish to.
type EmitJetStream struct {
	URL     string `json:"url"`
	Subject string `json:"subject"`
	// CredentialsEnv holds the content of a NATS .creds file.
	CredentialsEnv string `json:"credentialsEnv,omitempty"`
	TLS            *TLS   `json:"tls,omitempty"`
}

// EmitKafka is a Kafka topic, written by an idempotent producer.
type EmitKafka struct {
	BootstrapServers []string `json:"bootstrapServers"`
	Topic            string   `json:"topic"`
	SASL             *SASL    `json:"sasl,omitempty"`
	TLS              *TLS     `json:"tls,omitempty"`
}

// EmitRabbitMQ is an exchange and routing key, published with publisher
// confirms and mandatory routing.
type EmitRabbitMQ struct {
	// URIEnv holds the amqp(s):// URI, credentials included.
	URIEnv     string `json:"uriEnv"`
	Exchange   string `json:"exchange"`
	RoutingKey string `json:"routingKey"`
	TLS        *TLS   `json:"tls,omitempty"`
}

// EmitRedisStreams is a Redis stream (XADD).
type EmitRedisStreams struct {
	Address     string `json:"address"`
	PasswordEnv string `json:"passwordEnv,omitempty"`
	Stream      string `json:"stream"`
	TLS         *TLS   `json:"tls,omitempty"`
}

// EventIDHeader carries the derived event id on every target (on Redis an
// entry field); JetStream has Nats-Msg-Id as well, RabbitMQ the message-id
// property.
const EventIDHeader = "Idc-Event-Id"

// Target names the emit target in the derived event id; it changes when the
// target does, so two targets of one message never share an id.
func (e *Emit) Target() string {
	switch {
	case e.NATSJetStream != nil:
		return "natsJetStream:" + e.NATSJetStream.Subject
	case e.Kafka != nil:
		return "kafka:" + e.Kafka.Topic
	case e.RabbitMQ != nil:
		return "rabbitmq:" + e.RabbitMQ.Exchange + "/" + e.RabbitMQ.RoutingKey
	case e.RedisStreams != nil:
		return "redisStreams:" + e.RedisStreams.Stream
	}
	return ""
}

func (c *Config) validateEmit(bad func(string, string, ...any)) {
	e := c.Emit
	if e == nil {
		return
	}
	if n := e.validateTarget(bad); n != 1 {
		bad("emit", "exactly one target must be set (natsJetStream, kafka, rabbitmq, redisStreams), got %d", n)
	}
	switch e.When {
	case EmitAlways, EmitChanged:
	default:
		bad("emit.when", "must be Always or Changed, got %q", e.When)
	}
	for field, expr := range e.Payload {
		if field == "" {
			bad("emit.payload", "field names must not be empty")
		}
		if err := ValidateExpression(expr); err != nil {
			bad("emit.payload."+field, "%v", err)
		}
	}
	for name, expr := range e.Headers {
		if !validHeaderName(name) {
			bad("emit.headers", "header name %q must be a token (letters, digits, '-', '_', '.') and not a reserved one", name)
		}
		if err := ValidateExpression(expr); err != nil {
			bad("emit.headers."+name, "%v", err)
		}
		if e.RedisStreams != nil && name == "body" {
			bad("emit.headers.body", "is the field that holds the payload on Redis Streams")
		}
	}
	if c.Sink.Effect.HTTP != nil {
		bad("emit", "is not supported with the http effect (it runs outside the claim transaction)")
	}
}

// validHeaderName accepts an HTTP token-like name that is not one the
// runtime sets itself (Idc-Event-Id, Nats-*).
func validHeaderName(name string) bool {
	if name == "" || len(name) > 255 || strings.EqualFold(name, EventIDHeader) || strings.HasPrefix(strings.ToLower(name), "nats-") {
		return false
	}
	for _, r := range name {
		if !headerNameChar(r) {
			return false
		}
	}
	return true
}

func headerNameChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.'
}

// UsesOutbox reports whether this consumer writes <inbox>_outbox rows and
// runs the relay: spec.emit, or the http effect with delivery: Outbox.
func (c *Config) UsesOutbox() bool {
	return c.Emit != nil || c.Sink.Effect.HTTP != nil && c.Sink.Effect.HTTP.Delivery == HTTPOutbox
}

// validateTarget checks the configured targets and returns how many are set.
func (e *Emit) validateTarget(bad func(string, string, ...any)) int {
	n := 0
	if j := e.NATSJetStream; j != nil {
		n++
		if j.URL == "" {
			bad("emit.natsJetStream.url", "required")
		} else if strings.Contains(j.URL, "@") {
			bad("emit.natsJetStream.url", "must not carry credentials (user info); use credentialsSecretRef")
		}
		if j.Subject == "" || strings.ContainsAny(j.Subject, "*> \t\n") {
			bad("emit.natsJetStream.subject", "required, without wildcards or spaces, got %q", j.Subject)
		}
	}
	if k := e.Kafka; k != nil {
		n++
		if len(k.BootstrapServers) == 0 {
			bad("emit.kafka.bootstrapServers", "required")
		}
		if k.Topic == "" {
			bad("emit.kafka.topic", "required")
		}
	}
	if r := e.RabbitMQ; r != nil {
		n++
		if r.URIEnv == "" {
			bad("emit.rabbitmq.uriEnv", "required")
		}
		if r.Exchange == "" && r.RoutingKey == "" {
			bad("emit.rabbitmq.routingKey", "required with the default exchange (it names the queue)")
		}
	}
	if r := e.RedisStreams; r != nil {
		n++
		if r.Address == "" {
			bad("emit.redisStreams.address", "required")
		}
		if r.Stream == "" {
			bad("emit.redisStreams.stream", "required")
		}
	}
	return n
}
