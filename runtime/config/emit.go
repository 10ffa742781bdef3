package config

import "strings"

// Emit is the transactional outbox of a consumer: for every new message an
// event is written to <inbox>_outbox in the same transaction as the claim
// and the effect, and the relay publishes it to the target.
type Emit struct {
	// NATSJetStream publishes to a JetStream subject (the only target of
	// this version).
	NATSJetStream *EmitJetStream `json:"natsJetStream,omitempty"`
	// Payload maps output field names to value expressions (as columns);
	// empty means the incoming payload, unchanged.
	Payload map[string]string `json:"payload,omitempty"`
	// When is Always (every new message) or Changed (only messages whose
	// effect changed state; see the README's Pipelines section).
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

// Target names the emit target in the derived event id; it changes when the
// target does, so two targets of one message never share an id.
func (e *Emit) Target() string {
	if e.NATSJetStream != nil {
		return "natsJetStream:" + e.NATSJetStream.Subject
	}
	return ""
}

func (c *Config) validateEmit(bad func(string, string, ...any)) {
	e := c.Emit
	if e == nil {
		return
	}
	if e.NATSJetStream == nil {
		bad("emit", "exactly one target must be set (natsJetStream)")
	} else {
		j := e.NATSJetStream
		if j.URL == "" {
			bad("emit.natsJetStream.url", "required")
		} else if strings.Contains(j.URL, "@") {
			bad("emit.natsJetStream.url", "must not carry credentials (user info); use credentialsSecretRef")
		}
		if j.Subject == "" || strings.ContainsAny(j.Subject, "*> \t\n") {
			bad("emit.natsJetStream.subject", "required, without wildcards or spaces, got %q", j.Subject)
		}
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
	if c.Sink.Effect.HTTP != nil {
		bad("emit", "is not supported with the http effect (it runs outside the claim transaction)")
	}
}
