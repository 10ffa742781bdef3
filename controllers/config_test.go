package controllers

import (
	"testing"
	"time"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

func TestRenderConfigIsStableAndCarriesNoCredentials(t *testing.T) {
	idc := newConsumer("orders", "ORDERS", "orders-db")
	idc.Namespace = "shop"
	idc.Spec.Delivery = messagingv1alpha1.DeliverySpec{BatchSize: 200, MaxWait: "100ms", MaxAttempts: 3,
		Backoff: messagingv1alpha1.BackoffSpec{Initial: "1s", Max: "30s"}}
	a, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := renderConfig(idc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	if a.Hash != b.Hash || string(a.JSON) != string(b.JSON) {
		t.Fatalf("rendering is not deterministic:\n%s\n%s", a.JSON, b.JSON)
	}
	c := a.Config
	if c.Sink.Effect.Upsert.SequenceColumn != "version" {
		t.Errorf("sequenceColumn defaulted to %q, want the column mapped from the entity sequence (version)", c.Sink.Effect.Upsert.SequenceColumn)
	}
	if c.Delivery.BatchSize != 200 || c.Delivery.MaxWait.Duration != 100*time.Millisecond || c.Delivery.BackoffMax.Duration != 30*time.Second {
		t.Errorf("delivery not rendered: %+v", c.Delivery)
	}
	if c.Name != "shop/orders" || c.Sink.DSNEnv != envPostgresDSN || c.Sink.DeadLetterTable != "" {
		t.Errorf("unexpected config: name %q dsnEnv %q deadLetters %q", c.Name, c.Sink.DSNEnv, c.Sink.DeadLetterTable)
	}
	if len(a.Secrets) != 1 || a.Secrets[0].Ref.Name != "orders-db" {
		t.Errorf("secrets = %+v, want the DSN Secret only", a.Secrets)
	}

	idc.Spec.Delivery.BatchSize = 300
	changed, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	if changed.Hash == a.Hash {
		t.Fatal("a spec change must change the config hash (it rolls the pods)")
	}
}
