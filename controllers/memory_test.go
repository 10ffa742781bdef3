package controllers

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// The Secret memo forgets a Secret's data (the credentials) with its last
// user: a Secret shared by two resources stays while one of them uses it,
// a resource whose spec moves to another Secret lets the old one go, and
// once every user is deleted the memo holds nothing.
func TestSecretMemoForgetsWithItsLastUser(t *testing.T) {
	payments := unitConsumer()
	payments.Name, payments.UID = "payments", "uid-payments"
	payments.Spec.Source.NATSJetStream.Consumer = "payments"
	payments.Spec.Sink.Inbox.Table = "inbox_payments"
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db2", Namespace: "shop"}, Data: map[string][]byte{"dsn": []byte("postgres://db2/app")}}
	h := newHarness(t, unitConsumer(), payments, other)
	ctx := context.Background()
	reconcile := func(name string) {
		t.Helper()
		if _, err := h.r.Reconcile(ctx, reqFor("shop", name)); err != nil {
			t.Fatalf("Reconcile %s: %v", name, err)
		}
	}
	held := func() map[string]bool {
		out := map[string]bool{}
		for _, k := range h.r.memory.heldSecrets() {
			out[k.Name] = true
		}
		return out
	}
	reconcile("orders")
	reconcile("payments")
	if got := held(); len(got) != 1 || !got["db"] {
		t.Fatalf("memo holds %v after two passes on Secret db, want db", got)
	}

	// payments moves to Secret db2: db stays for orders, db2 is read.
	var p messagingv1alpha1.IdempotentConsumer
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "payments"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Sink.Postgres.ConnectionSecretRef.Name = "db2"
	if err := h.c.Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
	reconcile("payments")
	if got := held(); len(got) != 2 || !got["db"] || !got["db2"] {
		t.Fatalf("memo holds %v, want db (orders) and db2 (payments)", got)
	}

	// orders is deleted: db has no user left and goes; db2 stays.
	if err := h.c.Delete(ctx, unitConsumer()); err != nil {
		t.Fatal(err)
	}
	reconcile("orders")
	if got := held(); len(got) != 1 || !got["db2"] {
		t.Fatalf("memo holds %v after orders was deleted, want db2 alone", got)
	}

	// payments moves back to db (db2 goes), then is deleted: nothing left.
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "payments"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Sink.Postgres.ConnectionSecretRef.Name = "db"
	if err := h.c.Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
	reconcile("payments")
	if got := held(); len(got) != 1 || !got["db"] {
		t.Fatalf("memo holds %v, want db alone", got)
	}
	if err := h.c.Delete(ctx, &messagingv1alpha1.IdempotentConsumer{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "payments"}}); err != nil {
		t.Fatal(err)
	}
	reconcile("payments")
	if got := held(); len(got) != 0 {
		t.Fatalf("memory holds Secrets %v after every user was deleted, want none: credentials outlive the resources", got)
	}
	if resources, users := h.r.memory.size(); resources != 0 || users != 0 {
		t.Fatalf("memory left %d resource records and %d Secret users after every resource was deleted, want none", resources, users)
	}
}
