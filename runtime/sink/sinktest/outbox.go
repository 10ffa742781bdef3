package sinktest

import (
	"slices"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// setupWith is setup with inbox options (the outbox, the redrives log).
func setupWith(t *testing.T, h Harness, opts ...inbox.Option) *env {
	t.Helper()
	db, schema := h.Open(t)
	in, err := db.Inbox(config.Sink{Schema: schema, InboxTable: inboxTable, Layout: config.LayoutTable}, opts...)
	if err != nil {
		t.Fatalf("Inbox: %v", err)
	}
	if err := in.Migrate(ctx(t)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return &env{h: h, db: db, schema: schema, in: in}
}

// claimShard claims shard in a transaction of its own, which the caller
// ends.
func (e *env) claimShard(t *testing.T, shard int) (sink.Tx, []inbox.PendingEvent, bool) {
	t.Helper()
	tx := e.begin(t)
	events, ok, err := e.in.ClaimOutboxShard(ctx(t), tx, shard, 10)
	if err != nil {
		t.Fatalf("ClaimOutboxShard(%d): %v", shard, err)
	}
	return tx, events, ok
}

func eventIDs(events []inbox.PendingEvent) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.EventID
	}
	return out
}

// outbox: rows written with the claim, one relay per shard at a time (a
// second claim of a held shard says ok=false at once, another shard is
// free), the lock released at commit and at rollback, sent marks, failure
// counts, an event dead-lettered and requeued by a redrive, and prune.
func outbox(t *testing.T, h Harness) {
	e := setupWith(t, h, inbox.WithOutbox(true), inbox.WithRedrives())
	c := ctx(t)
	const shard, other = 3, 5
	rows := []inbox.OutboxRow{
		{EventID: "ev1", SourceID: "m1", Shard: shard, Payload: []byte(`{"n":1}`), Headers: map[string]string{"h": "v"}, OrderKey: "k1"},
		{EventID: "ev2", SourceID: "m2", Shard: shard, Payload: []byte{0, 1, 2}},
		{EventID: "ev3", SourceID: "m3", Shard: other, Payload: []byte(`{}`)},
	}
	tx := e.begin(t)
	e.claim(t, tx, "m1", "m2", "m3")
	if err := e.in.WriteOutbox(c, tx, rows); err != nil {
		t.Fatalf("WriteOutbox: %v", err)
	}
	commit(t, tx)
	// A repeated event id is kept as first written.
	tx = e.begin(t)
	if err := e.in.WriteOutbox(c, tx, []inbox.OutboxRow{{EventID: "ev1", SourceID: "m1", Shard: shard, Payload: []byte("other")}}); err != nil {
		t.Fatalf("WriteOutbox of a recorded event: %v", err)
	}
	commit(t, tx)
	if st, err := e.in.OutboxStats(c); err != nil || st.Pending != 3 || st.OldestAge < 0 {
		t.Fatalf("OutboxStats = %+v, %v; want 3 pending", st, err)
	}

	relay, events, ok := e.claimShard(t, shard)
	if !ok || !slices.Equal(eventIDs(events), []string{"ev1", "ev2"}) {
		t.Fatalf("claim of shard %d = %v ok=%v; want [ev1 ev2]", shard, eventIDs(events), ok)
	}
	ev1, ev2 := events[0], events[1]
	if string(ev1.Payload) != `{"n":1}` || ev1.Headers["h"] != "v" || ev1.OrderKey != "k1" || ev1.SourceID != "m1" || ev1.Shard != shard ||
		ev1.Attempts != 0 || ev1.CreatedAt.IsZero() || ev1.ID >= ev2.ID {
		t.Fatalf("ev1 = %+v", ev1)
	}
	if ev2.OrderKey != "m2" || len(ev2.Headers) != 0 || string(ev2.Payload) != "\x00\x01\x02" {
		t.Fatalf("ev2 = %+v; want the source id as its order key, no headers", ev2)
	}
	// Another relay: the held shard is refused at once, another one is free.
	second, got, ok := e.claimShard(t, shard)
	if ok || len(got) != 0 {
		t.Fatalf("second claim of a held shard: ok=%v %v; want ok=false", ok, eventIDs(got))
	}
	if got, ok, err := e.in.ClaimOutboxShard(c, second, other, 10); err != nil || !ok || !slices.Equal(eventIDs(got), []string{"ev3"}) {
		t.Fatalf("claim of shard %d beside = %v ok=%v %v; want [ev3]", other, eventIDs(got), ok, err)
	}
	if err := second.Rollback(c); err != nil {
		t.Fatal(err)
	}
	// Rollback released shard other.
	again, got, ok := e.claimShard(t, other)
	if !ok || len(got) != 1 {
		t.Fatalf("claim after a rollback: ok=%v %v; want the shard and ev3", ok, eventIDs(got))
	}
	if err := again.Rollback(c); err != nil {
		t.Fatal(err)
	}

	n, err := e.in.NoteOutboxFailure(c, relay, []int64{ev2.ID}, "boom", true)
	if err != nil || n[ev2.ID] != 1 {
		t.Fatalf("NoteOutboxFailure(counted) = %v, %v; want 1 attempt", n, err)
	}
	n, err = e.in.NoteOutboxFailure(c, relay, []int64{ev2.ID}, "unavailable", false)
	if err != nil || n[ev2.ID] != 1 || len(n) != 1 {
		t.Fatalf("NoteOutboxFailure(not counted) = %v, %v; want still 1", n, err)
	}
	if err := e.in.MarkOutboxSent(c, relay, []int64{ev1.ID}); err != nil {
		t.Fatalf("MarkOutboxSent: %v", err)
	}
	commit(t, relay)

	// Commit released the shard: what is left is ev2, with its attempt.
	relay, events, ok = e.claimShard(t, shard)
	if !ok || len(events) != 1 || events[0].EventID != "ev2" || events[0].Attempts != 1 {
		t.Fatalf("claim after commit = %+v ok=%v; want ev2 with 1 attempt", events, ok)
	}
	if err := e.in.DeadLetterOutbox(c, relay, events[0], "too large", inbox.OutboxRejectedClass); err != nil {
		t.Fatalf("DeadLetterOutbox: %v", err)
	}
	commit(t, relay)
	if st, err := e.in.OutboxStats(c); err != nil || st.Pending != 1 {
		t.Fatalf("OutboxStats after ev1 sent and ev2 dead-lettered = %+v, %v; want 1 pending (ev3)", st, err)
	}
	list, err := e.in.ListDeadLetters(c, inbox.DeadLetterFilter{Classes: []string{inbox.OutboxRejectedClass}}, 100)
	if err != nil || list.Total != 1 || len(list.DeadLetters) != 1 {
		t.Fatalf("ListDeadLetters(outbox_rejected) = %+v, %v; want ev2's", list, err)
	}
	dl := list.DeadLetters[0]
	if dl.MessageID != "m2" || dl.NativeID != inbox.OutboxNativeIDPrefix+"ev2" || dl.Reason != "outbox: too large" || dl.Attempts != 1 {
		t.Fatalf("ev2's dead letter = %+v", dl)
	}

	// A redrive requeues it: unsent, no attempts, in its source id's shard.
	tx = e.begin(t)
	d, err := e.in.LockDeadLetter(c, tx, dl.ID)
	if err != nil || d == nil || string(d.Payload) != "\x00\x01\x02" {
		t.Fatalf("LockDeadLetter = %+v, %v", d, err)
	}
	if err := e.in.RequeueOutbox(c, tx, *d); err != nil {
		t.Fatalf("RequeueOutbox: %v", err)
	}
	if err := e.in.DeleteDeadLetter(c, tx, d.ID); err != nil {
		t.Fatalf("DeleteDeadLetter: %v", err)
	}
	commit(t, tx)
	relay, events, ok = e.claimShard(t, inbox.OutboxShard("m2"))
	var requeued *inbox.PendingEvent
	for i := range events {
		if events[i].EventID == "ev2" {
			requeued = &events[i]
		}
	}
	if !ok || requeued == nil || requeued.Attempts != 0 || string(requeued.Payload) != "\x00\x01\x02" || requeued.SourceID != "m2" {
		t.Fatalf("requeued ev2 = %+v in %v ok=%v", requeued, eventIDs(events), ok)
	}
	if err := e.in.MarkOutboxSent(c, relay, []int64{requeued.ID}); err != nil {
		t.Fatal(err)
	}
	commit(t, relay)

	// Prune: the sent rows go (a window reaching past now takes every sent
	// row, one per batch), unsent ev3 stays however old.
	if n, err := e.in.PruneOutbox(c, time.Hour, 10, time.Minute); err != nil || n != 0 {
		t.Fatalf("PruneOutbox(1h) = %d, %v; want 0 (sent just now)", n, err)
	}
	// A relay holding ev3 (marked sent, not committed) is not waited for:
	// its row is skipped.
	relay, events, ok = e.claimShard(t, other)
	if !ok || len(events) != 1 {
		t.Fatalf("claim of shard %d = %v ok=%v", other, eventIDs(events), ok)
	}
	if err := e.in.MarkOutboxSent(c, relay, []int64{events[0].ID}); err != nil {
		t.Fatal(err)
	}
	if n, err := e.in.PruneOutbox(c, -time.Hour, 1, time.Minute); err != nil || n != 2 {
		t.Fatalf("PruneOutbox = %d, %v; want the 2 sent rows, not the relay's", n, err)
	}
	if st, err := e.in.OutboxStats(c); err != nil || st.Pending != 1 {
		t.Fatalf("OutboxStats after prune = %+v, %v; want ev3 still pending (its relay has not committed)", st, err)
	}
	commit(t, relay)
	if n, err := e.in.PruneOutbox(c, -time.Hour, 10, time.Minute); err != nil || n != 1 {
		t.Fatalf("PruneOutbox after the relay committed = %d, %v; want ev3", n, err)
	}
	if st, err := e.in.OutboxStats(c); err != nil || st.Pending != 0 || st.OldestAge != 0 {
		t.Fatalf("OutboxStats of an empty outbox = %+v, %v", st, err)
	}
	if _, _, err := e.in.ClaimOutboxShard(c, fakeTx{}, shard, 1); err == nil {
		t.Fatal("ClaimOutboxShard with another dialect's tx succeeded")
	}
}

// outboxAbsent: an inbox that never had an outbox has nothing to prune.
func outboxAbsent(t *testing.T, h Harness) {
	e := setup(t, h)
	if n, err := e.in.PruneOutbox(ctx(t), time.Hour, 10, time.Minute); err != nil || n != 0 {
		t.Fatalf("PruneOutbox without an outbox table = %d, %v; want 0, nil", n, err)
	}
	if sum, err := e.in.RedriveSummary(ctx(t), "r"); err != nil || sum.Total() != 0 {
		t.Fatalf("RedriveSummary without a redrives table = %+v, %v; want empty", sum, err)
	}
	// A later Migrate that asks for them creates them on the migrated inbox.
	in, err := e.db.Inbox(config.Sink{Schema: e.schema, InboxTable: inboxTable, Layout: config.LayoutTable}, inbox.WithOutbox(true), inbox.WithRedrives())
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(ctx(t)); err != nil {
		t.Fatalf("Migrate with the outbox: %v", err)
	}
	tx := e.begin(t)
	if err := in.WriteOutbox(ctx(t), tx, []inbox.OutboxRow{{EventID: "e", SourceID: "m", Shard: 0, Payload: []byte("p")}}); err != nil {
		t.Fatalf("WriteOutbox after the outbox was added: %v", err)
	}
	if err := in.RecordRedrive(ctx(t), tx, inbox.Redrive{Run: "r", DeadLetterID: 1, Outcome: "redriven"}); err != nil {
		t.Fatalf("RecordRedrive after the log was added: %v", err)
	}
	commit(t, tx)
	if st, err := in.OutboxStats(ctx(t)); err != nil || st.Pending != 1 {
		t.Fatalf("OutboxStats = %+v, %v; want 1", st, err)
	}
	if err := in.Drop(ctx(t)); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	// Drop took the optional tables too: migrated again without them,
	// the inbox has neither.
	if err := e.in.Migrate(ctx(t)); err != nil {
		t.Fatalf("Migrate after Drop: %v", err)
	}
	if _, err := e.in.OutboxStats(ctx(t)); err == nil {
		t.Error("the outbox table is left after Drop")
	}
	tx = e.begin(t)
	if err := e.in.RecordRedrive(ctx(t), tx, inbox.Redrive{Run: "r", DeadLetterID: 1, Outcome: "redriven"}); err == nil {
		t.Error("the redrives table is left after Drop")
	}
}
