// Package config is the runtime configuration: the one contract between the
// controller, which renders it from an IdempotentConsumer, and the consumer pod
// and prune job, which parse it. Credentials never appear here: the config
// names environment variables that the pod receives through secretKeyRef.
package config

import (
	"encoding/json"
	"fmt"
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

// IdentifierPattern is the rule every SQL identifier of a PostgreSQL sink
// must match (also enforced by the CRD); identifiers are quoted in SQL
// regardless.
var IdentifierPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// IdentifierPatternMySQL is IdentifierPattern at MySQL's length (64
// characters), for a mysql sink.
var IdentifierPatternMySQL = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,63}$`)

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
