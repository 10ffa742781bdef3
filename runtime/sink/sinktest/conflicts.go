package sinktest

import (
	"testing"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// idConflicts: a duplicate whose fingerprint differs from the claimed one
// is a conflict; the same fingerprint, no fingerprint on either side, and
// a fresh id are not. Recorded conflicts and id-conflict dead letters are
// counted. Existing reads which ids are claimed.
func idConflicts(t *testing.T, h Harness) {
	e := setup(t, h)
	c := ctx(t)
	tx := e.begin(t)
	if _, err := e.in.Claim(c, tx, []inbox.Claim{{MessageID: "a", Fingerprint: 11}, {MessageID: "b", Fingerprint: 22},
		{MessageID: "nofp"}}); err != nil {
		t.Fatal(err)
	}
	commit(t, tx)

	tx = e.begin(t)
	batch := []inbox.Claim{{MessageID: "a", Fingerprint: 11}, {MessageID: "b", Fingerprint: 99}, {MessageID: "new", Fingerprint: 5},
		{MessageID: "nofp", Fingerprint: 7}, {MessageID: "b"}}
	fresh, err := e.in.Claim(c, tx, batch)
	if err != nil {
		t.Fatal(err)
	}
	wantSet(t, "fresh", fresh, "new")
	conflicts, err := e.in.Conflicts(c, tx, batch, fresh)
	if err != nil {
		t.Fatalf("Conflicts: %v", err)
	}
	if len(conflicts) != 1 || conflicts[0] != (inbox.Conflict{Index: 1, MessageID: "b", Claimed: 22, Conflicted: 99}) {
		t.Fatalf("Conflicts = %+v; want b alone (claimed 22, conflicted 99)", conflicts)
	}
	if err := e.in.RecordConflicts(c, tx, []inbox.ConflictRecord{{Conflict: conflicts[0], NativeID: "n-b", Payload: []byte{0, 9}},
		{Conflict: conflicts[0]}}); err != nil {
		t.Fatalf("RecordConflicts: %v", err)
	}
	if _, err := e.in.DeadLetter(c, tx, []inbox.DeadLetter{{MessageID: "b", NativeID: "n-b2", Reason: "id conflict: payload differs", Class: "id_conflict"},
		{MessageID: "x", NativeID: "n-x", Reason: "database: not a conflict", Class: "database"},
		{MessageID: "y", NativeID: "n-y", Reason: "ID Conflict: not the runtime's text", Class: "evaluation"}}); err != nil {
		t.Fatal(err)
	}
	commit(t, tx)
	if n, err := e.in.ConflictCount(c); err != nil || n != 3 {
		t.Fatalf("ConflictCount = %d, %v; want 3 (2 recorded, 1 dead-lettered)", n, err)
	}
	if n := h.Count(t, e.db, e.schema, e.in.Names().IDConflicts); n != 2 {
		t.Fatalf("%d rows in the id conflicts table, want 2", n)
	}

	got, err := e.in.Existing(c, []string{"a", "new", "zz", "a"})
	if err != nil {
		t.Fatalf("Existing: %v", err)
	}
	wantSet(t, "Existing", got, "a", "new")
	if got, err := e.in.Existing(c, nil); err != nil || len(got) != 0 {
		t.Fatalf("Existing(nil) = %v, %v", got, err)
	}
}

// sqlEffect: the user's statement with :name parameters bound from value
// expressions (one name used twice; a :name inside a string literal and a
// comment left alone), once per record; a record whose parameter cannot be
// read fails alone; a name without a param is refused.
func sqlEffect(t *testing.T, h Harness) {
	e := setup(t, h)
	h.CreateOrders(t, e.db, e.schema, "orders")
	params := map[string]string{"id": "$.orderId", "status": "$.status", "v": "$.version"}
	build := func(stmt string) error {
		_, err := e.db.Effect(config.Effect{SQL: &config.SQL{Statement: stmt, Params: params}}, e.schema, nil)
		return err
	}
	if err := build("INSERT INTO " + e.schema + ".orders (order_id) VALUES (:nope)"); err == nil {
		t.Fatal("a statement naming a parameter that is not in params was accepted")
	}
	insert, err := e.db.Effect(config.Effect{SQL: &config.SQL{Params: params,
		Statement: "INSERT INTO " + e.schema + ".orders (order_id, status, version) VALUES (:id, :status, :v) /* :ignored */"}}, e.schema, nil)
	if err != nil {
		t.Fatalf("Effect: %v", err)
	}
	res := e.apply(t, insert, orderRec("m1", "o1", "created", 1), orderRec("m2", "o2", "created", 4), record("m3", "not json"))
	if res.Applied != 2 || len(res.Failed) != 1 || res.Failed[0].Index != 2 {
		t.Fatalf("sql insert: %+v; want 2 applied, the invalid payload failed alone", res)
	}
	update, err := e.db.Effect(config.Effect{SQL: &config.SQL{Params: params,
		Statement: "UPDATE " + e.schema + ".orders SET status = :status, version = :v\n" +
			"WHERE order_id = :id AND version < :v AND status <> 'it''s :status' -- :id\n"}}, e.schema, nil)
	if err != nil {
		t.Fatalf("Effect: %v", err)
	}
	res = e.apply(t, update, orderRec("m4", "o1", "paid", 2), orderRec("m5", "o2", "stale", 3))
	if res.Applied != 2 || len(res.Failed) != 0 {
		t.Fatalf("sql update: %+v; want both statements run", res)
	}
	got := h.Orders(t, e.db, e.schema, "orders")
	want := map[string]Order{"o1": {"paid", 2}, "o2": {"created", 4}}
	if len(got) != len(want) || got["o1"] != want["o1"] || got["o2"] != want["o2"] {
		t.Fatalf("orders = %+v, want %+v", got, want)
	}
}
