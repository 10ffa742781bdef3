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
		"bad header expr":      {func(c *Config) { c.Emit.Headers = map[string]string{"X-Status": "status"} }, "emit.headers.X-Status"},
		"header with a space":  {func(c *Config) { c.Emit.Headers = map[string]string{"X Status": "$.status"} }, "emit.headers"},
		"reserved header":      {func(c *Config) { c.Emit.Headers = map[string]string{"idc-event-id": "$.id"} }, "emit.headers"},
		"nats header":          {func(c *Config) { c.Emit.Headers = map[string]string{"Nats-Msg-Id": "$.id"} }, "emit.headers"},
		"redis body header": {func(c *Config) {
			c.Emit = &Emit{RedisStreams: &EmitRedisStreams{Address: "r:6379", Stream: "s"}, When: EmitAlways, Headers: map[string]string{"body": "$.a"}}
		}, "emit.headers.body"},
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

func TestHTTPDelivery(t *testing.T) {
	c := emitConfig(nil)
	c.Sink.Effect = Effect{HTTP: &HTTP{URL: "https://notify.example/orders"}}
	c.Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("valid http effect rejected: %v", err)
	}
	if c.Sink.Effect.HTTP.Delivery != HTTPInline || c.UsesOutbox() {
		t.Errorf("default delivery %q (outbox %v), want Inline without the outbox", c.Sink.Effect.HTTP.Delivery, c.UsesOutbox())
	}
	c.Sink.Effect.HTTP.Delivery = HTTPOutbox
	if err := c.Validate(); err != nil || !c.UsesOutbox() {
		t.Errorf("delivery Outbox: %v, outbox %v", err, c.UsesOutbox())
	}
	c.Sink.Effect.HTTP.Delivery = "Later"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "sink.effect.http.delivery") {
		t.Errorf("unknown delivery: %v, want an error naming sink.effect.http.delivery", err)
	}
}
