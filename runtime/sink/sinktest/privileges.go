package sinktest

import (
	"strings"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// leastPrivilege: the controller (the harness's admin connection) claims
// the inbox; the runtime then runs under a login holding only the grants
// the dialect documents for it (Harness.OpenAs): every operation the loop,
// prune and heartbeat perform works. Without INSERT on the inbox table the
// claim fails as ClassSink insufficient_privilege, and the error the loop
// shows names the GRANT to run (Harness.Advice). The same for an inbox
// with the outbox and the redrives log (leastPrivilegeOutbox).
func leastPrivilege(t *testing.T, h Harness) {
	if h.OpenAs == nil || h.Advice == nil {
		t.Fatal("the harness has no OpenAs or Advice: every dialect documents its least-privilege grants and tests them")
	}
	for _, layout := range []config.Layout{config.LayoutTable, config.LayoutPartitioned} {
		t.Run(string(layout), func(t *testing.T) { leastPrivilegeIn(t, h, layout) })
	}
	t.Run("OutboxAndRedrive", func(t *testing.T) { leastPrivilegeOutbox(t, h) })
}

func leastPrivilegeIn(t *testing.T, h Harness, layout config.Layout) {
	ctl, id := setupLayout(t, h, layout, inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "least", UID: "u1"})
	c := ctx(t)
	n := ctl.in.Names()
	sinkCfg := config.Sink{Schema: ctl.schema, InboxTable: inboxTable, Layout: layout}
	runtimeEnv := func(without Revoke) *env {
		db := h.OpenAs(t, ctl.db, ctl.schema, n, layout, without)
		in, err := db.Inbox(sinkCfg, inbox.WithExpectedEpoch(id.Epoch))
		if err != nil {
			t.Fatal(err)
		}
		return &env{h: h, db: db, schema: ctl.schema, in: in}
	}
	rt := runtimeEnv(Revoke{})
	if err := rt.in.Verify(c); err != nil {
		t.Fatalf("Verify under the runtime's grants: %v", err)
	}
	// The runtime migrates at start: on an inbox the controller migrated,
	// a no-op its grants allow.
	if err := rt.in.Migrate(c); err != nil {
		t.Fatalf("Migrate of a current inbox under the runtime's grants: %v", err)
	}
	now, _, err := rt.in.Progress(c)
	if err != nil {
		t.Fatalf("Progress: %v", err)
	}
	// The days from 10 back on (on MySQL a day below the oldest partition
	// lands in it: the days to drop are made first).
	if err := rt.in.EnsurePartitions(c, inbox.Day(now).AddDate(0, 0, -10), 12); err != nil {
		t.Fatalf("EnsurePartitions: %v", err)
	}
	old := names("old", 10)
	wantSet(t, "claims", rt.mustClaimPublished(t, inbox.Day(now).AddDate(0, 0, -10), old...), old...)
	tx := rt.begin(t)
	wantSet(t, "claim in a transaction", rt.claim(t, tx, "a", "b", old[0]), "a", "b")
	if err := rt.in.Unclaim(c, tx, []string{"b"}); err != nil {
		t.Fatalf("Unclaim: %v", err)
	}
	if _, err := rt.in.DeadLetter(c, tx, []inbox.DeadLetter{{MessageID: "b", NativeID: "n-b", Reason: "bad", Payload: []byte("{}")}}); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	commit(t, tx)
	if err := rt.in.WriteHeartbeat(c, inbox.Heartbeat{Replica: "r1", Positions: map[string]int64{"S": 1}}); err != nil {
		t.Fatalf("WriteHeartbeat: %v", err)
	}
	if _, err := rt.in.UpdateWindow(c, func(*inbox.WindowState) (*inbox.WindowState, error) {
		return &inbox.WindowState{Window: time.Hour, InputsHash: "h", Source: "Broker", DerivedFrom: "d", RedeliveryHorizon: "1h",
			ReplayHorizon: "1h", AdoptedAt: now}, nil
	}); err != nil {
		t.Fatalf("UpdateWindow: %v", err)
	}
	if w, err := rt.in.ReadWindow(c); err != nil || w == nil || w.Window != time.Hour {
		t.Fatalf("ReadWindow = %+v, %v", w, err)
	}
	if _, err := rt.in.Stats(c); err != nil {
		t.Fatalf("Stats: %v", err)
	}
	h.Age(t, ctl.db, ctl.schema, inboxTable, old, 100*time.Hour)
	if layout == config.LayoutPartitioned {
		if res, err := rt.in.PrunePartitions(c, inbox.Bound{Window: 72 * time.Hour}); err != nil || res.PartitionsDropped < 1 {
			t.Fatalf("PrunePartitions = %+v, %v; want the day 10 back dropped", res, err)
		}
	} else if res, err := rt.in.PruneTable(c, inbox.Bound{Window: time.Hour}, 3, time.Minute); err != nil || res.RowsDeleted != int64(len(old)) {
		t.Fatalf("PruneTable = %+v, %v; want %d deleted", res, err, len(old))
	}
	if run, err := rt.in.LastPruneRun(c); err != nil || run == nil || run.Error != "" {
		t.Fatalf("LastPruneRun = %+v, %v", run, err)
	}
	if err := rt.in.Verify(c); err != nil {
		t.Fatalf("Verify after the prune: %v", err)
	}

	// One grant short: INSERT on the inbox table.
	bad := runtimeEnv(Revoke{Privilege: "INSERT", Table: n.Inbox})
	_, err = bad.claimOnce([]string{"z"})
	if err == nil {
		t.Fatal("a claim without INSERT on the inbox succeeded")
	}
	wantGrantNamed(t, h, bad.db, err, "INSERT", n.Inbox)
}

// wantGrantNamed fails unless err, from db run one grant short, classifies
// as insufficient_privilege and names the GRANT of privilege on table.
func wantGrantNamed(t *testing.T, h Harness, db sink.DB, err error, privilege, table string) {
	t.Helper()
	if class, reason := db.Classify(err); class != sink.ClassSink || reason != sink.ReasonInsufficientPrivilege {
		t.Fatalf("Classify(%v) = %d, %q; want ClassSink insufficient_privilege", err, class, reason)
	}
	advice := h.Advice(db, err)
	if !strings.HasPrefix(advice, "GRANT ") || !strings.Contains(advice, privilege) || !strings.Contains(advice, table) {
		t.Fatalf("Advice(%v) = %q; want the GRANT of %s on %s", err, advice, privilege, table)
	}
	t.Logf("without %s on %s: %v", privilege, table, err)
	if !strings.Contains(err.Error(), advice) {
		t.Fatalf("the error the loop shows does not name the GRANT %q: %v", advice, err)
	}
}
