package config

import (
	"strings"
	"testing"
)

func emitConfig(e *Emit) Config {
	c := Config{
		Source:  Source{NATSJetStream: &JetStream{URL: "nats://127.0.0.1:4222", Stream: "S", Consumer: "c"}},
		Message: Message{ID: Extractor{JSONPath: "$.id"}},
		Sink: Sink{DSNEnv: "DSN", Schema: "public", InboxTable: "inbox",
			Effect: Effect{Append: &Append{Table: "t", Columns: map[string]string{"a": "$.a"}}}},
		Emit: e,
	}
	c.Default()
	return c
}

func TestEmitValidation(t *testing.T) {
	valid := func() *Emit {
		return &Emit{NATSJetStream: &EmitJetStream{URL: "nats://out:4222", Subject: "order-projected.v1"}}
	}
	c := emitConfig(valid())
	if err := c.Validate(); err != nil {
		t.Fatalf("valid emit rejected: %v", err)
	}
	if c.Emit.When != EmitAlways || c.Emit.Target() != "natsJetStream:order-projected.v1" {
		t.Errorf("when %q target %q", c.Emit.When, c.Emit.Target())
	}
	cases := map[string]struct {
		mutate func(*Config)
		field  string
	}{
		"no target":            {func(c *Config) { c.Emit.NATSJetStream = nil }, "emit:"},
		"url with user info":   {func(c *Config) { c.Emit.NATSJetStream.URL = "nats://u:p@out:4222" }, "emit.natsJetStream.url"},
		"wildcard subject":     {func(c *Config) { c.Emit.NATSJetStream.Subject = "orders.>" }, "emit.natsJetStream.subject"},
		"empty subject":        {func(c *Config) { c.Emit.NATSJetStream.Subject = "" }, "emit.natsJetStream.subject"},
		"unknown when":         {func(c *Config) { c.Emit.When = "Sometimes" }, "emit.when"},
		"bad payload":          {func(c *Config) { c.Emit.Payload = map[string]string{"x": "status"} }, "emit.payload.x"},
		"with the http effect": {func(c *Config) { c.Sink.Effect = Effect{HTTP: &HTTP{URL: "https://b/c"}} }, "emit:"},
	}
	for name, tc := range cases {
		c := emitConfig(valid())
		tc.mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got %v, want an error naming %s", name, err, tc.field)
		}
	}
}
