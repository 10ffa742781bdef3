package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// deletionPolicy: Delete on tables the inbox's meta table does not mark as
// the operator's: the drop is refused at once (no retry until
// --drop-timeout), a Warning event says so and names the table, and the
// resource goes with the tables left in place.
func TestDeletionRefusesTablesNotMarkedAsTheOperators(t *testing.T) {
	idc := unitConsumer()
	idc.Spec.Sink.Inbox.DeletionPolicy = messagingv1alpha1.DeletionPolicyDelete
	h := newHarness(t, idc)
	rec := events.NewFakeRecorder(100)
	h.r.recorder = rec
	got, _ := h.pass()
	h.sink.dropErr = fmt.Errorf("while dropping inbox projections.inbox_orders: %w: \"projections\".\"inbox_orders\" exists but the inbox meta table \"projections\".\"inbox_orders_meta\" does not", inbox.ErrNotOperatorInbox)
	if err := h.c.Delete(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Reconcile(context.Background(), reqFor("shop", "orders")); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, got); err == nil {
		t.Fatal("the resource is still there: a refused drop must not be retried")
	}
	close(rec.Events)
	var warned bool
	for e := range rec.Events {
		if strings.HasPrefix(e, "Warning "+messagingv1alpha1.ReasonInboxRetained) && strings.Contains(e, "refusing to drop") &&
			strings.Contains(e, "not marked as an idc-operator inbox") && strings.Contains(e, "inbox_orders_meta") {
			warned = true
		}
		if strings.Contains(e, "InboxDropped") {
			t.Errorf("an InboxDropped event for a refused drop: %q", e)
		}
	}
	if !warned {
		t.Fatal("no Warning event saying the drop was refused and why")
	}
}
