package sinktest

import (
	"slices"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// leastPrivilegeOutbox: the controller provisions an inbox with the
// outbox (spec.emit, http delivery: Outbox) and the redrives log (a
// redrive run); the runtime then runs under exactly the dialect's grants
// with those options (Harness.OpenAs, RuntimeGrants with the options):
// its Migrate finds every table and runs no DDL, the outbox is written in
// a claim transaction, a relay claims a shard, notes a failure, marks an
// event sent and dead-letters another, a redrive settles that one (locks
// the dead letter, requeues the event, deletes the dead letter, records
// the redrive) and another that fails again, and prune deletes the sent
// event. Without INSERT on the outbox the write fails as ClassSink
// insufficient_privilege, and the error names the GRANT to run.
func leastPrivilegeOutbox(t *testing.T, h Harness) {
	opts := []inbox.Option{inbox.WithOutbox(true), inbox.WithRedrives()}
	db, schema := h.Open(t)
	c := ctx(t)
	sinkCfg := config.Sink{Schema: schema, InboxTable: inboxTable, Layout: config.LayoutTable}
	ctl, err := db.Inbox(sinkCfg, opts...)
	if err != nil {
		t.Fatalf("Inbox: %v", err)
	}
	id, err := ctl.MigrateFor(c, &inbox.OwnerClaim{Owner: inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "least-outbox", UID: "u2"}})
	if err != nil {
		t.Fatalf("MigrateFor with the outbox and the redrives log: %v", err)
	}
	n := ctl.Names()
	runtimeEnv := func(without Revoke) *env {
		rdb := h.OpenAs(t, db, schema, n, config.LayoutTable, without, opts...)
		in, err := rdb.Inbox(sinkCfg, append([]inbox.Option{inbox.WithExpectedEpoch(id.Epoch)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return &env{h: h, db: rdb, schema: schema, in: in}
	}
	rt := runtimeEnv(Revoke{})
	if err := rt.in.Verify(c); err != nil {
		t.Fatalf("Verify under the runtime's grants: %v", err)
	}
	if err := rt.in.Migrate(c); err != nil {
		t.Fatalf("Migrate of a current inbox with its outbox and redrives log under the runtime's grants: %v", err)
	}

	// The outbox, written with the claim.
	const shard = 3
	tx := rt.begin(t)
	wantSet(t, "claims", rt.claim(t, tx, "m1", "m2"), "m1", "m2")
	if err := rt.in.WriteOutbox(c, tx, []inbox.OutboxRow{
		{EventID: "ev1", SourceID: "m1", Shard: shard, Payload: []byte(`{"n":1}`), Headers: map[string]string{"h": "v"}, OrderKey: "k1"},
		{EventID: "ev2", SourceID: "m2", Shard: shard, Payload: []byte(`{"n":2}`)},
	}); err != nil {
		t.Fatalf("WriteOutbox: %v", err)
	}
	commit(t, tx)
	if st, err := rt.in.OutboxStats(c); err != nil || st.Pending != 2 {
		t.Fatalf("OutboxStats = %+v, %v; want 2 pending", st, err)
	}

	// The relay: a shard claimed, a failure noted, an event sent.
	relay, events, ok := rt.claimShard(t, shard)
	if !ok || !slices.Equal(eventIDs(events), []string{"ev1", "ev2"}) {
		t.Fatalf("ClaimOutboxShard(%d) = %v ok=%v; want [ev1 ev2]", shard, eventIDs(events), ok)
	}
	ev1, ev2 := events[0], events[1]
	if got, err := rt.in.NoteOutboxFailure(c, relay, []int64{ev2.ID}, "boom", true); err != nil || got[ev2.ID] != 1 {
		t.Fatalf("NoteOutboxFailure = %v, %v; want 1 attempt", got, err)
	}
	if err := rt.in.MarkOutboxSent(c, relay, []int64{ev1.ID}); err != nil {
		t.Fatalf("MarkOutboxSent: %v", err)
	}
	commit(t, relay)
	relay, events, ok = rt.claimShard(t, shard)
	if !ok || len(events) != 1 || events[0].EventID != "ev2" || events[0].Attempts != 1 {
		t.Fatalf("ClaimOutboxShard(%d) after the commit = %+v ok=%v; want ev2 with 1 attempt", shard, events, ok)
	}
	if err := rt.in.DeadLetterOutbox(c, relay, events[0], "too large", inbox.OutboxRejectedClass); err != nil {
		t.Fatalf("DeadLetterOutbox: %v", err)
	}
	commit(t, relay)

	// A redrive: the rejected event requeued, a message dead letter that
	// fails again; each locked, settled and recorded in one transaction.
	tx = rt.begin(t)
	if _, err := rt.in.DeadLetter(c, tx, []inbox.DeadLetter{{MessageID: "m3", NativeID: "n-m3", Reason: "bad", Payload: []byte("{}")}}); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	commit(t, tx)
	rejected, err := rt.in.SelectDeadLetters(c, inbox.DeadLetterFilter{Classes: []string{inbox.OutboxRejectedClass}})
	if err != nil || len(rejected) != 1 {
		t.Fatalf("SelectDeadLetters(outbox_rejected) = %v, %v; want ev2's", rejected, err)
	}
	all, err := rt.in.SelectDeadLetters(c, inbox.DeadLetterFilter{})
	if err != nil || len(all) != 2 {
		t.Fatalf("SelectDeadLetters = %v, %v; want ev2's and m3's", all, err)
	}
	tx = rt.begin(t)
	d, err := rt.in.LockDeadLetter(c, tx, rejected[0])
	if err != nil || d == nil || d.NativeID != inbox.OutboxNativeIDPrefix+"ev2" {
		t.Fatalf("LockDeadLetter = %+v, %v; want ev2's", d, err)
	}
	if err := rt.in.RequeueOutbox(c, tx, *d); err != nil {
		t.Fatalf("RequeueOutbox: %v", err)
	}
	if err := rt.in.DeleteDeadLetter(c, tx, d.ID); err != nil {
		t.Fatalf("DeleteDeadLetter: %v", err)
	}
	if err := rt.in.RecordRedrive(c, tx, inbox.Redrive{Run: "r1", DeadLetterID: d.ID, MessageID: d.MessageID, Outcome: "requeued"}); err != nil {
		t.Fatalf("RecordRedrive: %v", err)
	}
	commit(t, tx)
	other := all[0]
	if other == d.ID {
		other = all[1]
	}
	tx = rt.begin(t)
	if m3, err := rt.in.LockDeadLetter(c, tx, other); err != nil || m3 == nil || m3.MessageID != "m3" {
		t.Fatalf("LockDeadLetter(m3) = %+v, %v", m3, err)
	}
	if err := rt.in.FailDeadLetterAgain(c, tx, other, "evaluation: again", "evaluation"); err != nil {
		t.Fatalf("FailDeadLetterAgain: %v", err)
	}
	if err := rt.in.RecordRedrive(c, tx, inbox.Redrive{Run: "r1", DeadLetterID: other, MessageID: "m3", Outcome: "failed", Reason: "evaluation: again"}); err != nil {
		t.Fatalf("RecordRedrive: %v", err)
	}
	commit(t, tx)
	if sum, err := rt.in.RedriveSummary(c, "r1"); err != nil || sum.Outcomes["requeued"] != 1 || sum.Outcomes["failed"] != 1 || sum.Total() != 2 {
		t.Fatalf("RedriveSummary(r1) = %+v, %v; want 1 requeued, 1 failed", sum, err)
	}
	if left, err := rt.in.SelectDeadLetters(c, inbox.DeadLetterFilter{}); err != nil || !slices.Equal(left, []int64{other}) {
		t.Fatalf("dead letters after the redrive = %v, %v; want [%d] (m3's)", left, err, other)
	}

	// Prune: the sent ev1 goes, the requeued ev2 (unsent) stays.
	if got, err := rt.in.PruneOutbox(c, -time.Hour, 10, time.Minute); err != nil || got != 1 {
		t.Fatalf("PruneOutbox = %d, %v; want ev1", got, err)
	}
	if st, err := rt.in.OutboxStats(c); err != nil || st.Pending != 1 {
		t.Fatalf("OutboxStats after the prune = %+v, %v; want ev2 pending", st, err)
	}
	if err := rt.in.Verify(c); err != nil {
		t.Fatalf("Verify after the outbox and the redrive: %v", err)
	}

	// One grant short: INSERT on the outbox. The claim still works; the
	// outbox write in its transaction does not.
	bad := runtimeEnv(Revoke{Privilege: "INSERT", Table: n.Outbox})
	tx = bad.begin(t)
	wantSet(t, "claim without INSERT on the outbox", bad.claim(t, tx, "m9"), "m9")
	err = bad.in.WriteOutbox(c, tx, []inbox.OutboxRow{{EventID: "ev9", SourceID: "m9", Shard: shard, Payload: []byte("{}")}})
	if err == nil {
		t.Fatal("an outbox write without INSERT on the outbox table succeeded")
	}
	wantGrantNamed(t, h, bad.db, err, "INSERT", n.Outbox)
}
