package config

import (
	"strings"
	"testing"
)

func TestDeliveryInFlightDefaultsAndBounds(t *testing.T) {
	c := Config{
		Source:  Source{NATSJetStream: &JetStream{URL: "nats://127.0.0.1:4222", Stream: "S", Consumer: "c"}},
		Message: Message{ID: Extractor{JSONPath: "$.id"}},
		Sink: Sink{DSNEnv: "DSN", Schema: "public", InboxTable: "inbox",
			Effect: Effect{Append: &Append{Table: "t", Columns: map[string]string{"a": "$.a"}}}},
	}
	c.Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaulted config rejected: %v", err)
	}
	if c.Delivery.InFlight != 2 || c.Delivery.Replicas != 1 {
		t.Errorf("defaults: inFlight=%d replicas=%d, want 2 and 1", c.Delivery.InFlight, c.Delivery.Replicas)
	}
	for _, n := range []int{-1, 9} {
		bad := c
		bad.Delivery.InFlight = n
		err := bad.Validate()
		if err == nil || !strings.Contains(err.Error(), "delivery.inFlight") {
			t.Errorf("inFlight=%d: got %v, want an error naming delivery.inFlight", n, err)
		}
	}
}

func TestDeliveryLimitSizing(t *testing.T) {
	d := Delivery{BatchSize: 500, InFlight: 2}
	if got := d.MinUnacked(4); got != 4000 {
		t.Errorf("MinUnacked(4) = %d, want 4 x 500 x 2 = 4000", got)
	}
	if got := d.SizedUnacked(4); got != 16000 {
		t.Errorf("SizedUnacked(4) = %d, want 4 x 4000", got)
	}
	if got := d.MinUnacked(0); got != 1000 {
		t.Errorf("MinUnacked(0) = %d, want one replica's 1000", got)
	}
}

func TestRabbitMQPrefetchDefaultCoversInFlight(t *testing.T) {
	for _, tc := range []struct{ batch, inFlight, want int }{
		{500, 2, 4000},
		{10000, 8, 65535}, // capped at AMQP's 16-bit limit
	} {
		s := Source{RabbitMQ: &RabbitMQ{URIEnv: "U", Queue: "q"}}
		s.defaults(Delivery{BatchSize: tc.batch, InFlight: tc.inFlight})
		if s.RabbitMQ.Prefetch != tc.want {
			t.Errorf("batch %d inFlight %d: prefetch %d, want %d", tc.batch, tc.inFlight, s.RabbitMQ.Prefetch, tc.want)
		}
	}
	s := Source{RabbitMQ: &RabbitMQ{URIEnv: "U", Queue: "q", Prefetch: 50}}
	s.defaults(Delivery{BatchSize: 500, InFlight: 2})
	if s.RabbitMQ.Prefetch != 50 {
		t.Errorf("a declared prefetch was overwritten: %d", s.RabbitMQ.Prefetch)
	}
}
