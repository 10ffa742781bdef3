// Package config is the runtime configuration: the one contract between the
// controller, which renders it from an IdempotentConsumer, and the consumer pod
// and prune job, which parse it. Credentials never appear here: the config
// names environment variables that the pod receives through secretKeyRef.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"
)

// Version of the config format; the runtime refuses a config it does not know.
const Version = "v1"

// Config is the whole runtime configuration.
type Config struct {
	Version string `json:"version"`
	// Name is "<namespace>/<name>" of the IdempotentConsumer, used in logs and
	// as a label value.
	Name      string    `json:"name"`
	Source    Source    `json:"source"`
	Message   Message   `json:"message"`
	Sink      Sink      `json:"sink"`
	Delivery  Delivery  `json:"delivery"`
	Retention Retention `json:"retention"`
	// Emit, when set, writes an outgoing event per new message to the
	// inbox's outbox table in the claim transaction; the relay publishes it.
	Emit *Emit `json:"emit,omitempty"`
	// HealthAddr serves /metrics, /healthz and /readyz, e.g. ":8080".
	HealthAddr string `json:"healthAddr,omitempty"`
}

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

// Extractor reads one value from a message: exactly one field is set.
type Extractor struct {
	Header       string `json:"header,omitempty"`
	JSONPath     string `json:"jsonPath,omitempty"`
	BrokerNative bool   `json:"brokerNative,omitempty"`
}

func (e Extractor) count() int {
	n := 0
	if e.Header != "" {
		n++
	}
	if e.JSONPath != "" {
		n++
	}
	if e.BrokerNative {
		n++
	}
	return n
}

// Message says where the dedup id and the optional entity key/sequence are.
type Message struct {
	ID Extractor `json:"id"`
	// OnPayloadMismatch is what a duplicate id with a different payload
	// fingerprint (a producer reusing an id) does: Record (default),
	// DeadLetter or Ignore. It is counted in idc_id_conflicts_total in every
	// case.
	OnPayloadMismatch string  `json:"onPayloadMismatch,omitempty"`
	Entity            *Entity `json:"entity,omitempty"`
}

// Values of Message.OnPayloadMismatch.
const (
	PayloadMismatchRecord     = "Record"
	PayloadMismatchDeadLetter = "DeadLetter"
	PayloadMismatchIgnore     = "Ignore"
)

// Entity turns on the sequence gate.
type Entity struct {
	Key      Extractor `json:"key"`
	Sequence Extractor `json:"sequence"`
}

// Layout of the inbox table.
type Layout string

const (
	LayoutTable       Layout = "Table"
	LayoutPartitioned Layout = "Partitioned"
)

// Sink is the PostgreSQL database and the effect applied there.
type Sink struct {
	// DSNEnv holds the PostgreSQL connection string.
	DSNEnv          string `json:"dsnEnv"`
	Schema          string `json:"schema"`
	InboxTable      string `json:"inboxTable"`
	Layout          Layout `json:"layout"`
	DeadLetterTable string `json:"deadLetterTable,omitempty"`
	Effect          Effect `json:"effect"`
	// InboxEpoch is the epoch of the inbox the controller provisioned
	// (status.inbox.epoch): the runtime, its prune and redrive Jobs claim
	// into that inbox only, and hold when it is lost ("" before the
	// controller recorded one).
	InboxEpoch string `json:"inboxEpoch,omitempty"`
}

// Effect holds exactly one effect block. Column and parameter values are
// value expressions: "$.a.b" (JSON path into the payload), "@messageId",
// "@publishedAt", "@payload" (the whole payload as jsonb) or "@header:<Name>".
type Effect struct {
	Upsert *Upsert `json:"upsert,omitempty"`
	Append *Append `json:"append,omitempty"`
	SQL    *SQL    `json:"sql,omitempty"`
	HTTP   *HTTP   `json:"http,omitempty"`
}

// Kind names the configured effect.
func (e Effect) Kind() string {
	switch {
	case e.Upsert != nil:
		return "upsert"
	case e.Append != nil:
		return "append"
	case e.SQL != nil:
		return "sql"
	case e.HTTP != nil:
		return "http"
	}
	return ""
}

// Upsert writes the latest state per key, gated by SequenceColumn.
type Upsert struct {
	Table   string            `json:"table"`
	Key     []string          `json:"key"`
	Columns map[string]string `json:"columns"`
	// SequenceColumn, when set, is the sequence gate: a row is updated only
	// when the incoming value is greater than the stored one.
	SequenceColumn string `json:"sequenceColumn,omitempty"`
}

// Append inserts one row per new message.
type Append struct {
	Table   string            `json:"table"`
	Columns map[string]string `json:"columns"`
}

// SQL runs a user statement per new message with :name parameters bound.
type SQL struct {
	Statement string            `json:"statement"`
	Params    map[string]string `json:"params,omitempty"`
}

// HTTP calls a remote endpoint with an Idempotency-Key header.
type HTTP struct {
	URL     string   `json:"url"`
	Method  string   `json:"method"`
	Timeout Duration `json:"timeout"`
	// Delivery is Inline (the loop calls the endpoint, then claims and
	// acks) or Outbox (the claim and an outbox row commit together and the
	// message is acked at once; the relay's dispatcher calls the endpoint).
	Delivery string `json:"delivery,omitempty"`
	// DenyNetworks are CIDRs the effect never connects to, checked on the
	// address actually dialled (after DNS): the manager's --http-deny-networks
	// (link-local and cloud metadata addresses by default).
	DenyNetworks []string `json:"denyNetworks,omitempty"`
}

// Values of HTTP.Delivery.
const (
	HTTPInline = "Inline"
	HTTPOutbox = "Outbox"
)

// Delivery tunes batching and retries.
type Delivery struct {
	BatchSize      int      `json:"batchSize"`
	MaxWait        Duration `json:"maxWait"`
	MaxAttempts    int      `json:"maxAttempts"`
	BackoffInitial Duration `json:"backoffInitial"`
	BackoffMax     Duration `json:"backoffMax"`
	// InFlight is how many transactions one replica runs at once, each on
	// its own connection, on lanes split by entity key (else id) hash.
	InFlight int `json:"inFlight"`
	// Replicas is the declared replica count (spec.runtime.replicas). It
	// only sizes broker-side consumer limits shared by all replicas
	// (JetStream MaxAckPending); the controller leaves it out of the config
	// hash, so scaling does not roll the pods.
	Replicas int `json:"replicas,omitempty"`
	// Batching is Adaptive (the default) or Fixed: how long a fetch waits
	// when fewer than a batch of messages are waiting (see Batching).
	Batching Batching `json:"batching,omitempty"`
}

// Batching says when a fetch that finds less than a whole batch returns.
type Batching string

const (
	// BatchingAdaptive: a fetch returns what is waiting at once, and when
	// nothing is, as soon as the first message arrives; under backlog the
	// batch still fills. maxWait only bounds an idle wait.
	BatchingAdaptive Batching = "Adaptive"
	// BatchingFixed: when nothing is waiting, a fetch waits up to maxWait
	// for a whole batch (the behaviour before adaptive batching; kept for
	// side-by-side measurements and for who wants the fewest transactions).
	BatchingFixed Batching = "Fixed"
)

// Limit sizing. A JetStream replica holds at most about this many fetches
// (of batchSize x inFlight each) delivered and not yet acknowledged: the one
// its lanes commit, one queued (a batch per lane), the one being handed to
// the lanes, and the one the adapter has requested ahead. A RabbitMQ
// replica's prefetch holds the same (its buffer stands in for the request
// ahead). A broker limit below MinUnacked cannot fill the declared
// replicas' batches; one the runtime creates gets limitHeadroom times that.
const limitHeadroom = 4

// MinUnacked is the smallest broker-side limit on unacknowledged messages
// that lets every declared replica fill its in-flight batches:
// replicas x batchSize x inFlight.
func (d Delivery) MinUnacked(replicas int) int {
	return max(replicas, 1) * d.BatchSize * max(d.InFlight, 1)
}

// SizedUnacked is the limit the runtime gives a broker-side consumer it
// creates: MinUnacked with headroom, so the next batches are fetched while
// the current ones commit.
func (d Delivery) SizedUnacked(replicas int) int {
	return limitHeadroom * d.MinUnacked(replicas)
}

// Retention is what the prune job needs.
type Retention struct {
	// Mode is Derived or Explicit.
	Mode              string   `json:"mode"`
	Window            Duration `json:"window,omitempty"`
	MaxConsumerOutage Duration `json:"maxConsumerOutage,omitempty"`
	SafetyMargin      Duration `json:"safetyMargin,omitempty"`
	MaxReplayAge      Duration `json:"maxReplayAge,omitempty"`
	PruneBatchSize    int      `json:"pruneBatchSize,omitempty"`
	PruneMaxDuration  Duration `json:"pruneMaxDuration,omitempty"`
	// ConsumerTimeout is RabbitMQ's consumer_timeout (the lease of each
	// delivery) when the broker does not run with its default of 30m; the
	// management API does not expose the broker-wide setting. Zero means the
	// broker default; negative means disabled (no lease, so attempts are
	// unbounded). A queue's x-consumer-timeout argument or consumer-timeout
	// policy key, when present, wins. Only RabbitMQ sources read it.
	ConsumerTimeout Duration `json:"consumerTimeout,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("1m30s").
type Duration struct{ time.Duration }

// MarshalJSON writes the Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// IdentifierPattern is the rule every SQL identifier must match (also
// enforced by the CRD schema); identifiers are quoted in SQL regardless.
var IdentifierPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Load reads and validates a config file.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return Parse(b)
}

// Parse decodes and validates a config, rejecting unknown fields.
func Parse(b []byte) (*Config, error) {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("decoding config: %w", err)
	}
	c.Default()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Default fills zero values with the documented defaults.
func (c *Config) Default() {
	if c.Version == "" {
		c.Version = Version
	}
	if c.Message.OnPayloadMismatch == "" {
		c.Message.OnPayloadMismatch = PayloadMismatchRecord
	}
	if c.HealthAddr == "" {
		c.HealthAddr = ":8080"
	}
	if c.Sink.Layout == "" {
		c.Sink.Layout = LayoutTable
	}
	c.Delivery.defaults()
	c.Source.defaults(c.Delivery)
	if c.Emit != nil && c.Emit.When == "" {
		c.Emit.When = EmitAlways
	}
	if h := c.Sink.Effect.HTTP; h != nil {
		if h.Method == "" {
			h.Method = "POST"
		}
		if h.Timeout.Duration == 0 {
			h.Timeout.Duration = 10 * time.Second
		}
		if h.Delivery == "" {
			h.Delivery = HTTPInline
		}
	}
	if c.Retention.PruneBatchSize == 0 {
		c.Retention.PruneBatchSize = 10000
	}
	if c.Retention.PruneMaxDuration.Duration == 0 {
		c.Retention.PruneMaxDuration.Duration = 10 * time.Minute
	}
}

func (d *Delivery) defaults() {
	if d.BatchSize == 0 {
		d.BatchSize = 500
	}
	if d.MaxWait.Duration == 0 {
		d.MaxWait.Duration = 200 * time.Millisecond
	}
	if d.MaxAttempts == 0 {
		d.MaxAttempts = 5
	}
	if d.BackoffInitial.Duration == 0 {
		d.BackoffInitial.Duration = 500 * time.Millisecond
	}
	if d.BackoffMax.Duration == 0 {
		d.BackoffMax.Duration = time.Minute
	}
	if d.InFlight == 0 {
		d.InFlight = 2
	}
	if d.Replicas == 0 {
		d.Replicas = 1
	}
	if d.Batching == "" {
		d.Batching = BatchingAdaptive
	}
}

// maxPrefetch is RabbitMQ's largest prefetch count (a 16-bit field).
const maxPrefetch = 65535

func (s *Source) defaults(d Delivery) {
	if r := s.RabbitMQ; r != nil && r.Prefetch == 0 {
		// Prefetch is per channel, so per replica.
		r.Prefetch = min(d.SizedUnacked(1), maxPrefetch)
	}
	if r := s.RedisStreams; r != nil {
		if r.BodyField == "" {
			r.BodyField = "body"
		}
		if r.ClaimMinIdle.Duration == 0 {
			r.ClaimMinIdle.Duration = 30 * time.Second
		}
	}
}

// Validate returns every problem found, each naming its field.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	ident := func(field, v string) {
		if !IdentifierPattern.MatchString(v) {
			bad(field, "%q is not a valid SQL identifier (must match %s)", v, IdentifierPattern)
		}
	}
	if c.Version != Version {
		bad("version", "unsupported config version %q (this runtime reads %q)", c.Version, Version)
	}
	c.validateSource(bad)
	switch c.Message.OnPayloadMismatch {
	case PayloadMismatchRecord, PayloadMismatchDeadLetter, PayloadMismatchIgnore:
	default:
		bad("message.onPayloadMismatch", "must be Record, DeadLetter or Ignore, got %q", c.Message.OnPayloadMismatch)
	}
	if n := c.Message.ID.count(); n != 1 {
		bad("message.id", "exactly one of header, jsonPath, brokerNative must be set (got %d)", n)
	}
	if e := c.Message.Entity; e != nil {
		if e.Key.count() != 1 || e.Key.BrokerNative {
			bad("message.entity.key", "exactly one of header, jsonPath must be set")
		}
		if e.Sequence.count() != 1 || e.Sequence.BrokerNative {
			bad("message.entity.sequence", "exactly one of header, jsonPath must be set")
		}
	}
	s := c.Sink
	if s.DSNEnv == "" {
		bad("sink.dsnEnv", "required")
	}
	ident("sink.schema", s.Schema)
	ident("sink.inboxTable", s.InboxTable)
	// Empty: runtime/inbox derives "<inbox>_dead_letters", shortened with a
	// hash when that would pass PostgreSQL's 63-byte limit.
	if s.DeadLetterTable != "" {
		ident("sink.deadLetterTable", s.DeadLetterTable)
	}
	if s.Layout != LayoutTable && s.Layout != LayoutPartitioned {
		bad("sink.layout", "must be Table or Partitioned, got %q", s.Layout)
	}
	c.validateEffect(bad, ident)
	c.validateEmit(bad)
	c.Delivery.validate(bad)
	return errors.Join(errs...)
}

func (d Delivery) validate(bad func(string, string, ...any)) {
	if d.BatchSize < 1 || d.BatchSize > 10000 {
		bad("delivery.batchSize", "must be between 1 and 10000, got %d", d.BatchSize)
	}
	if d.InFlight < 1 || d.InFlight > 8 {
		bad("delivery.inFlight", "must be between 1 and 8, got %d", d.InFlight)
	}
	if d.Batching != "" && d.Batching != BatchingAdaptive && d.Batching != BatchingFixed {
		bad("delivery.batching", "must be Adaptive or Fixed, got %q", d.Batching)
	}
	if d.Replicas < 0 {
		bad("delivery.replicas", "must not be negative, got %d", d.Replicas)
	}
	if d.MaxAttempts < 1 {
		bad("delivery.maxAttempts", "must be at least 1, got %d", d.MaxAttempts)
	}
	if d.MaxWait.Duration <= 0 || d.BackoffInitial.Duration <= 0 || d.BackoffMax.Duration < d.BackoffInitial.Duration {
		bad("delivery", "maxWait and backoffInitial must be positive and backoffMax >= backoffInitial")
	}
}

func (c *Config) validateSource(bad func(string, string, ...any)) {
	n := 0
	if j := c.Source.NATSJetStream; j != nil {
		n++
		if j.URL == "" || j.Stream == "" || j.Consumer == "" {
			bad("source.natsJetStream", "url, stream and consumer are required")
		}
	}
	if k := c.Source.Kafka; k != nil {
		n++
		if len(k.BootstrapServers) == 0 || len(k.Topics) == 0 || k.ConsumerGroup == "" {
			bad("source.kafka", "bootstrapServers, topics and consumerGroup are required")
		}
	}
	if r := c.Source.RabbitMQ; r != nil {
		n++
		if r.URIEnv == "" || r.Queue == "" {
			bad("source.rabbitmq", "uriEnv and queue are required")
		}
	}
	if r := c.Source.RedisStreams; r != nil {
		n++
		if r.Address == "" || r.Stream == "" || r.Group == "" {
			bad("source.redisStreams", "address, stream and group are required")
		}
	}
	if n != 1 {
		bad("source", "exactly one of natsJetStream, kafka, rabbitmq, redisStreams must be set (got %d)", n)
	}
}

func (c *Config) validateEffect(bad func(string, string, ...any), ident func(string, string)) {
	e := c.Sink.Effect
	n := 0
	if u := e.Upsert; u != nil {
		n++
		ident("sink.effect.upsert.table", u.Table)
		if len(u.Key) == 0 {
			bad("sink.effect.upsert.key", "at least one key column is required")
		}
		for _, k := range u.Key {
			if _, ok := u.Columns[k]; !ok {
				bad("sink.effect.upsert.key", "key column %q is not among columns", k)
			}
		}
		if u.SequenceColumn != "" {
			if _, ok := u.Columns[u.SequenceColumn]; !ok {
				bad("sink.effect.upsert.sequenceColumn", "%q is not among columns", u.SequenceColumn)
			}
		}
		validateColumns("sink.effect.upsert.columns", u.Columns, bad, ident)
	}
	if a := e.Append; a != nil {
		n++
		ident("sink.effect.append.table", a.Table)
		validateColumns("sink.effect.append.columns", a.Columns, bad, ident)
	}
	if s := e.SQL; s != nil {
		n++
		if strings.TrimSpace(s.Statement) == "" {
			bad("sink.effect.sql.statement", "required")
		}
		for name, expr := range s.Params {
			ident("sink.effect.sql.params", name)
			if err := ValidateExpression(expr); err != nil {
				bad("sink.effect.sql.params."+name, "%v", err)
			}
		}
	}
	if h := e.HTTP; h != nil {
		n++
		if !strings.HasPrefix(h.URL, "http://") && !strings.HasPrefix(h.URL, "https://") {
			bad("sink.effect.http.url", "must start with http:// or https://")
		}
		validateDenyNetworks(h.DenyNetworks, bad)
		if h.Delivery != "" && h.Delivery != HTTPInline && h.Delivery != HTTPOutbox {
			bad("sink.effect.http.delivery", "must be Inline or Outbox, got %q", h.Delivery)
		}
	}
	if n != 1 {
		bad("sink.effect", "exactly one of upsert, append, sql, http must be set (got %d)", n)
	}
}

func validateDenyNetworks(nets []string, bad func(string, string, ...any)) {
	for i, n := range nets {
		if _, err := netip.ParsePrefix(n); err != nil {
			bad(fmt.Sprintf("sink.effect.http.denyNetworks[%d]", i), "%q is not a CIDR (e.g. 169.254.0.0/16)", n)
		}
	}
}

func validateColumns(field string, cols map[string]string, bad func(string, string, ...any), ident func(string, string)) {
	if len(cols) == 0 {
		bad(field, "at least one column is required")
	}
	for col, expr := range cols {
		ident(field, col)
		if err := ValidateExpression(expr); err != nil {
			bad(field+"."+col, "%v", err)
		}
	}
}

// ValidateExpression checks the syntax of a value expression.
func ValidateExpression(expr string) error {
	switch {
	case expr == "@messageId", expr == "@publishedAt", expr == "@payload":
		return nil
	case strings.HasPrefix(expr, "@header:") && len(expr) > len("@header:"):
		return nil
	case expr == "$" || strings.HasPrefix(expr, "$."):
		for _, part := range strings.Split(strings.TrimPrefix(strings.TrimPrefix(expr, "$"), "."), ".") {
			if part == "" && expr != "$" {
				return fmt.Errorf("JSON path %q has an empty segment", expr)
			}
		}
		return nil
	}
	return fmt.Errorf("value %q must be a JSON path ($.field) or one of @messageId, @publishedAt, @payload, @header:<Name>", expr)
}
