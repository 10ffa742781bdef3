package config

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Validate returns every problem found, each naming its field.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	pattern := IdentifierPattern
	if c.Sink.DatabaseKind() == SinkMySQL {
		pattern = IdentifierPatternMySQL
	}
	ident := func(field, v string) {
		if !pattern.MatchString(v) {
			bad(field, "%q is not a valid SQL identifier (must match %s)", v, pattern)
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
	switch s.Kind {
	case "", SinkPostgres, SinkMySQL:
	default:
		bad("sink.kind", "must be postgres or mysql, got %q", s.Kind)
	}
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
		j.validatePartitions(bad)
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

func (j *JetStream) validatePartitions(bad func(string, string, ...any)) {
	switch {
	case j.Partitions < 0 || j.Partitions == 1 || j.Partitions > MaxPartitions:
		bad("source.natsJetStream.partitions", "must be 0 (not partitioned) or between 2 and %d, got %d", MaxPartitions, j.Partitions)
	case j.Partitions > 0 && j.FilterSubject != "":
		bad("source.natsJetStream.filterSubject", "must be empty with partitions: each partition's filter is derived from the stream's partitioning subject transform")
	}
}
