package open

import (
	"context"
	"testing"

	"github.com/go-logr/logr"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// Every adapter is opened through Open against its real broker in
// test/integration; these are the cases that need no broker.
func TestOpenRejects(t *testing.T) {
	js := &config.Config{Source: config.Source{NATSJetStream: &config.JetStream{URL: "nats://127.0.0.1:4222", Stream: "S", Consumer: "c"}}}
	if _, err := Open(context.Background(), js, logr.Discard(), ""); err == nil {
		t.Error("an empty consumer name was accepted")
	}
	if _, err := Open(context.Background(), &config.Config{}, logr.Discard(), "pod-0"); err == nil {
		t.Error("a config without a source was accepted")
	}
	// A missing credential is reported by the adapter, wrapped, with a nil
	// interface (not a typed nil) returned.
	rmq := &config.Config{Source: config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: "IDC_OPEN_TEST_UNSET_URI", Queue: "q"}}}
	src, err := Open(context.Background(), rmq, logr.Discard(), "pod-0")
	if err == nil || src != nil {
		t.Errorf("Open = %v, %v; want a nil source and an error", src, err)
	}
}
