package config

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
