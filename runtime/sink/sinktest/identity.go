package sinktest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// identity: the controller's Check (ready only when migrated, current, the
// claim's owner and epoch; a lost or another owner's inbox refused),
// MarkRestored (lost until a person accepts), DropOwned (only the owner's).
func identity(t *testing.T, h Harness) {
	for _, layout := range []config.Layout{config.LayoutTable, config.LayoutPartitioned} {
		t.Run(string(layout), func(t *testing.T) { identityIn(t, h, layout) })
	}
}

func identityIn(t *testing.T, h Harness, layout config.Layout) {
	c := ctx(t)
	db, schema := h.Open(t)
	in, err := db.Inbox(config.Sink{Schema: schema, InboxTable: inboxTable, Layout: layout})
	if err != nil {
		t.Fatal(err)
	}
	a := inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "a", UID: "u1"}
	b := inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "b", UID: "u2"}
	if _, v, ready, err := in.Check(c, inbox.OwnerClaim{Owner: a}); err != nil || v != 0 || ready {
		t.Fatalf("Check before Migrate = version %d, ready %v, %v; want 0, false, nil", v, ready, err)
	}
	if err := in.DropOwned(c, a); err != nil {
		t.Fatalf("DropOwned of nothing: %v", err)
	}
	if err := in.Migrate(c); err != nil {
		t.Fatal(err)
	}
	if _, v, ready, err := in.Check(c, inbox.OwnerClaim{Owner: a}); err != nil || v != inbox.SchemaVersion || ready {
		t.Fatalf("Check of an unclaimed inbox = version %d, ready %v, %v; want current, not ready", v, ready, err)
	}
	if err := in.DropOwned(c, a); !errors.Is(err, inbox.ErrNotOwner) {
		t.Fatalf("DropOwned of an inbox with no owner = %v; want ErrNotOwner", err)
	}
	id, err := in.MigrateFor(c, &inbox.OwnerClaim{Owner: a})
	if err != nil {
		t.Fatal(err)
	}
	got, v, ready, err := in.Check(c, inbox.OwnerClaim{Owner: a, Epoch: id.Epoch})
	if err != nil || !ready || v != inbox.SchemaVersion || got.Owner != a || got.Epoch != id.Epoch {
		t.Fatalf("Check(a) = %+v, %d, %v, %v; want ready with a and epoch %s", got, v, ready, err, id.Epoch)
	}
	var owned *inbox.OwnedError
	if _, _, _, err := in.Check(c, inbox.OwnerClaim{Owner: b}); !errors.As(err, &owned) || owned.Owner != a {
		t.Fatalf("Check(b) = %v; want an OwnedError naming a", err)
	}
	if _, _, _, err := in.Check(c, inbox.OwnerClaim{Owner: a, Epoch: "someotherepoch"}); !inbox.IsLost(err) {
		t.Fatalf("Check with another epoch = %v; want a LostError", err)
	}

	// Restored from a backup: lost for the controller and the runtime.
	if err := in.MarkRestored(c, "notthisepoch"); err != nil {
		t.Fatal(err)
	}
	if _, _, ready, err := in.Check(c, inbox.OwnerClaim{Owner: a, Epoch: id.Epoch}); err != nil || !ready {
		t.Fatalf("MarkRestored of another epoch changed the inbox: ready %v, %v", ready, err)
	}
	if err := in.MarkRestored(c, id.Epoch); err != nil {
		t.Fatal(err)
	}
	var lost *inbox.LostError
	if _, _, _, err := in.Check(c, inbox.OwnerClaim{Owner: a, Epoch: id.Epoch}); !errors.As(err, &lost) || !strings.Contains(lost.What, "restored") {
		t.Fatalf("Check after MarkRestored = %v; want a LostError saying restored", err)
	}
	rt, err := db.Inbox(config.Sink{Schema: schema, InboxTable: inboxTable, Layout: layout}, inbox.WithExpectedEpoch(id.Epoch))
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Verify(c); !inbox.IsLost(err) {
		t.Fatalf("runtime Verify after MarkRestored = %v; want a LostError", err)
	}
	if _, err := in.MigrateFor(c, &inbox.OwnerClaim{Owner: a, Epoch: id.Epoch}); !inbox.IsLost(err) {
		t.Fatalf("MigrateFor after MarkRestored = %v; want a LostError", err)
	}
	next, err := in.MigrateFor(c, &inbox.OwnerClaim{Owner: a, Epoch: id.Epoch, AcceptLoss: true})
	if err != nil || next.Epoch == "" || next.Epoch == id.Epoch {
		t.Fatalf("MigrateFor accepting the loss = %+v, %v; want a new epoch", next, err)
	}
	if _, _, ready, err := in.Check(c, inbox.OwnerClaim{Owner: a, Epoch: next.Epoch}); err != nil || !ready {
		t.Fatalf("Check with the new epoch = ready %v, %v", ready, err)
	}

	if err := in.DropOwned(c, b); !errors.Is(err, inbox.ErrNotOwner) {
		t.Fatalf("DropOwned(b) = %v; want ErrNotOwner", err)
	}
	if v, err := in.SchemaVersion(c); err != nil || v != inbox.SchemaVersion {
		t.Fatalf("after a refused DropOwned: SchemaVersion = %d, %v", v, err)
	}
	if err := in.DropOwned(c, a); err != nil {
		t.Fatalf("DropOwned(a): %v", err)
	}
	if v, err := in.SchemaVersion(c); err != nil || v != 0 {
		t.Fatalf("after DropOwned: SchemaVersion = %d, %v; want 0", v, err)
	}
	if err := in.DropOwned(c, a); err != nil {
		t.Fatalf("DropOwned again: %v", err)
	}
}

// stats: the gauges of an empty inbox are zero; the oldest row's age is
// the aged row's; the row estimate reaches the rows claimed (estimates are
// refreshed asynchronously on both databases: polled, bounded).
func stats(t *testing.T, h Harness) {
	for _, layout := range []config.Layout{config.LayoutTable, config.LayoutPartitioned} {
		t.Run(string(layout), func(t *testing.T) {
			e, _ := setupLayout(t, h, layout, inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "stats", UID: "u1"})
			c := ctx(t)
			st, err := e.in.Stats(c)
			if err != nil || st.OldestAge != 0 || st.Rows < 0 {
				t.Fatalf("Stats of an empty inbox = %+v, %v; want no age", st, err)
			}
			ids := names("stat", 40)
			e.mustClaimPublished(t, inbox.Day(time.Now()), ids...)
			h.Age(t, e.db, e.schema, inboxTable, ids[:3], 2*time.Hour)
			deadline := time.Now().Add(30 * time.Second)
			for {
				st, err = e.in.Stats(c)
				if err != nil {
					t.Fatal(err)
				}
				if st.OldestAge < 2*time.Hour || st.OldestAge > 2*time.Hour+5*time.Minute {
					t.Fatalf("OldestAge = %s; want the aged rows' 2h", st.OldestAge)
				}
				if st.Rows >= int64(len(ids))/2 {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("Rows = %d after 30s; want about %d", st.Rows, len(ids))
				}
				time.Sleep(200 * time.Millisecond) // polling the estimate, not synchronizing
			}
		})
	}
}
