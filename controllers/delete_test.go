package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

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

// A deletion whose spec no longer renders completes at once, leaves the
// tables in place and says so in a Warning event.
func TestDeletionOfASpecThatNoLongerRenders(t *testing.T) {
	idc := unitConsumer()
	idc.Spec.Sink.Inbox.DeletionPolicy = messagingv1alpha1.DeletionPolicyDelete
	h := newHarness(t, idc)
	got, _ := h.pass()
	if len(got.Finalizers) != 1 {
		t.Fatalf("finalizers %v, want the drop-inbox one", got.Finalizers)
	}
	// An id rule the runtime config refuses (a stricter release, say).
	got.Spec.Message.ID = messagingv1alpha1.IDSpec{}
	if err := h.c.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Delete(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Reconcile(context.Background(), reqFor("shop", "orders")); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, got); err == nil {
		t.Fatalf("the resource is still there, finalizers %v", got.Finalizers)
	}
	if n := h.sink.count("Drop"); n != 0 {
		t.Fatalf("Drop called %d times for a spec that does not render", n)
	}
	rec := h.r.recorder.(*events.FakeRecorder)
	var seen []string
	for len(rec.Events) > 0 {
		seen = append(seen, <-rec.Events)
	}
	if !containsWith(seen, "Warning "+messagingv1alpha1.ReasonInboxRetained, "projections.inbox_orders", "no longer renders") {
		t.Fatalf("no InboxRetained Warning naming the table among %q", seen)
	}
	if len(h.sink.released) == 0 || h.sink.released[len(h.sink.released)-1] != "shop/orders" {
		t.Fatalf("the pool of the deleted resource was not released: %v", h.sink.released)
	}
}

// A sink database that stays unreachable holds a deletion for
// --drop-timeout at most, then the tables are left in place.
func TestDeletionGivesUpOnAnUnreachableDatabase(t *testing.T) {
	idc := unitConsumer()
	idc.Spec.Sink.Inbox.DeletionPolicy = messagingv1alpha1.DeletionPolicyDelete
	h := newHarness(t, idc)
	got, _ := h.pass()
	h.sink.dropErr = errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	if err := h.c.Delete(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	res, err := h.r.Reconcile(context.Background(), reqFor("shop", "orders"))
	if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > dropRetry {
		t.Fatalf("first try: %v, requeue %s; want a retry within %s", err, res.RequeueAfter, dropRetry)
	}
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, got); err != nil {
		t.Fatalf("the resource went before the drop timed out: %v", err)
	}
	h.clk.Step(h.r.opts.DropTimeout + time.Second)
	if _, err := h.r.Reconcile(context.Background(), reqFor("shop", "orders")); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, got); err == nil {
		t.Fatal("the resource is still there after --drop-timeout")
	}
}

func containsWith(events []string, subs ...string) bool {
	for _, e := range events {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(e, s)
		}
		if all {
			return true
		}
	}
	return false
}
