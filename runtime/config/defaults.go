package config

import "time"

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
