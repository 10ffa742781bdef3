package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	jssource "github.com/idempotency-dev/idc-operator/runtime/source/jetstream"
)

// The JetStream consumer the runtime creates for an autoscaled resource is
// sized for maxReplicas: MaxAckPending = headroom 4 x maxReplicas x
// batchSize x inFlight, from the config the controller renders (the real
// runtime source against the real NATS on loopback).
func TestAutoscaledJetStreamConsumerSizedForMaxReplicas(t *testing.T) {
	nc, err := nats.Connect(natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("NATS with JetStream must run on 127.0.0.1:4222 (make services): %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := fmt.Sprintf("IDC_KEDA_LIMITS_%d", time.Now().UnixNano())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}, MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), stream) }()

	idc := withAutoscaling(unitConsumer(), 1, 6)
	idc.Spec.Source.NATSJetStream.URL, idc.Spec.Source.NATSJetStream.Stream = natsURL, stream
	idc.Spec.Delivery.BatchSize, idc.Spec.Delivery.InFlight = 250, 3
	rc := mustRender(t, idc)
	src, err := jssource.New(ctx, rc.Config.Source.NATSJetStream, testr.New(t), jssource.WithDelivery(rc.Config.Delivery))
	if err != nil {
		t.Fatal(err)
	}
	_ = src.Close()
	c, err := js.Consumer(ctx, stream, idc.Spec.Source.NATSJetStream.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.CachedInfo().Config.MaxAckPending, 4*6*250*3; got != want {
		t.Fatalf("MaxAckPending %d, want headroom 4 x maxReplicas 6 x batchSize 250 x inFlight 3 = %d", got, want)
	}
}
