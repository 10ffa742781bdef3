package sinktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

func progress(t *testing.T, h Harness) {
	e := setup(t, h)
	r := e.heartbeats(t)
	back := e.staleAndBack(t, r)
	e.retire(t, r, back)
}

// heartbeats writes two replicas' rows and checks r1's, which it returns.
func (e *env) heartbeats(t *testing.T) inbox.ProgressRecord {
	c := ctx(t)
	created := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	consumer := &inbox.ConsumerIdentity{Kind: "NATSJetStream", Name: "S/d", Created: &created}
	commitAge, unackedAge := 2*time.Second, 5*time.Second
	if err := e.in.WriteHeartbeat(c, inbox.Heartbeat{Replica: "r1", LastCommitAge: &commitAge, UnackedAge: &unackedAge,
		Positions: map[string]int64{"S": 7}, Consumer: consumer}); err != nil {
		t.Fatalf("WriteHeartbeat: %v", err)
	}
	if err := e.in.WriteHeartbeat(c, inbox.Heartbeat{Replica: "r2", Stopped: true}); err != nil {
		t.Fatalf("WriteHeartbeat r2: %v", err)
	}
	now, recs, err := e.in.Progress(c)
	if err != nil || len(recs) != 2 {
		t.Fatalf("Progress = %d rows, %v; want 2", len(recs), err)
	}
	r := recs[0]
	if r.Replica != "r1" {
		r = recs[1]
	}
	if r.HeartbeatAt.After(now) || r.LastCommitAt == nil || r.UnackedSince == nil {
		t.Fatalf("r1 = %+v at database time %s", r, now)
	}
	// One statement, one database clock: the ages are exact.
	if d := r.HeartbeatAt.Sub(*r.UnackedSince); d != unackedAge {
		t.Errorf("heartbeat - unacked_since = %s, want %s", d, unackedAge)
	}
	if d := r.HeartbeatAt.Sub(*r.LastCommitAt); d != commitAge {
		t.Errorf("heartbeat - last_commit_at = %s, want %s", d, commitAge)
	}
	if r.Positions["S"] != 7 || r.Consumer == nil || !r.Consumer.Same(*consumer) || r.Stopped {
		t.Errorf("r1 = %+v (consumer %+v)", r, r.Consumer)
	}
	return r
}

// staleAndBack marks r stale, then has the replica heartbeat again, and
// returns the row as it reads then.
func (e *env) staleAndBack(t *testing.T, r inbox.ProgressRecord) inbox.ProgressRecord {
	c := ctx(t)
	if err := e.in.MarkStale(c, r, map[string]int64{"S": 9}); err != nil {
		t.Fatalf("MarkStale: %v", err)
	}
	if err := e.in.MarkStale(c, r, map[string]int64{"S": 10}); !inbox.IsProgressMoved(err) {
		t.Fatalf("MarkStale twice = %v; want IsProgressMoved", err)
	}
	_, recs, _ := e.in.Progress(c)
	for _, x := range recs {
		if x.Replica == "r1" && (x.StaleSince == nil || x.SettleMark["S"] != 9) {
			t.Errorf("after MarkStale: %+v", x)
		}
	}
	// The replica comes back: the mark is cleared, its consumer kept.
	if err := e.in.WriteHeartbeat(c, inbox.Heartbeat{Replica: "r1"}); err != nil {
		t.Fatal(err)
	}
	_, recs, _ = e.in.Progress(c)
	var back inbox.ProgressRecord
	for _, x := range recs {
		if x.Replica == "r1" {
			back = x
		}
	}
	if back.StaleSince != nil || back.SettleMark != nil || back.Consumer == nil || back.UnackedSince != nil {
		t.Errorf("after a new heartbeat: %+v", back)
	}
	if err := e.in.MarkStale(c, r, nil); !inbox.IsProgressMoved(err) {
		t.Errorf("MarkStale with the old read = %v; want IsProgressMoved", err)
	}
	return back
}

// retire retires r1 by an old read (kept) and by the current one (gone).
func (e *env) retire(t *testing.T, r, back inbox.ProgressRecord) {
	c := ctx(t)
	var recs []inbox.ProgressRecord
	if err := e.in.RetireProgress(c, r); err != nil {
		t.Fatal(err)
	}
	if _, recs, _ = e.in.Progress(c); len(recs) != 2 {
		t.Errorf("RetireProgress with an old read removed the row: %d rows", len(recs))
	}
	if err := e.in.RetireProgress(c, back); err != nil {
		t.Fatal(err)
	}
	if _, recs, _ = e.in.Progress(c); len(recs) != 1 || recs[0].Replica != "r2" || !recs[0].Stopped {
		t.Errorf("after RetireProgress: %+v", recs)
	}
}

func window(t *testing.T, h Harness) {
	e := setup(t, h)
	c := ctx(t)
	if st, err := e.in.ReadWindow(c); err != nil || st != nil {
		t.Fatalf("ReadWindow on a new inbox = %+v, %v; want nil", st, err)
	}
	since := time.Date(2026, 3, 4, 5, 6, 7, 891000000, time.UTC)
	stored, err := e.in.UpdateWindow(c, func(cur *inbox.WindowState) (*inbox.WindowState, error) {
		if cur != nil {
			return nil, fmt.Errorf("current = %+v, want nil", cur)
		}
		return &inbox.WindowState{Window: 2*time.Hour + time.Microsecond, InputsHash: "h1", Source: "Broker", DerivedFrom: "stream S max_age=2h",
			RedeliveryHorizon: "1h", ReplayHorizon: "2h", AdoptedAt: since, PendingWindow: time.Hour, PendingSince: &since}, nil
	})
	if err != nil {
		t.Fatalf("UpdateWindow: %v", err)
	}
	read, err := e.in.ReadWindow(c)
	if err != nil || read == nil {
		t.Fatalf("ReadWindow = %+v, %v", read, err)
	}
	for _, st := range []*inbox.WindowState{stored, read} {
		if st.Window != 2*time.Hour+time.Millisecond || st.PendingWindow != time.Hour || st.PendingSince == nil ||
			!st.PendingSince.Equal(since) || !st.AdoptedAt.Equal(since) || st.InputsHash != "h1" || st.UpdatedAt.IsZero() {
			t.Errorf("stored window = %+v (rounded up to the millisecond, pending kept)", st)
		}
	}
	if _, err := e.in.UpdateWindow(c, func(*inbox.WindowState) (*inbox.WindowState, error) { return nil, nil }); err != nil {
		t.Fatalf("UpdateWindow(nil): %v", err)
	}
	// Concurrent read-modify-writes take turns: none is lost.
	const writers = 6
	e.concurrentWindowUpdates(t, writers)
	read, _ = e.in.ReadWindow(c)
	if want := 2*time.Hour + time.Millisecond + writers*time.Second; read.Window != want || read.PendingSince != nil {
		t.Fatalf("after %d concurrent updates: window %s pending %v, want %s and no pending shrink", writers, read.Window, read.PendingSince, want)
	}
}

// windowBeforeMigrate: an inbox not migrated yet stores no window; an
// update says to migrate first.
func windowBeforeMigrate(t *testing.T, h Harness) {
	db, schema := h.Open(t)
	in, err := db.Inbox(config.Sink{Schema: schema, InboxTable: inboxTable, Layout: config.LayoutTable})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := in.ReadWindow(ctx(t)); st != nil || err != nil {
		t.Fatalf("ReadWindow before Migrate = %+v, %v; want nil, nil", st, err)
	}
	_, err = in.UpdateWindow(ctx(t), func(*inbox.WindowState) (*inbox.WindowState, error) {
		return &inbox.WindowState{Window: time.Hour}, nil
	})
	if !errors.Is(err, inbox.ErrNoWindowTable) {
		t.Fatalf("UpdateWindow before Migrate = %v; want ErrNoWindowTable", err)
	}
}

// concurrentWindowUpdates has writers add a second to the window at once.
func (e *env) concurrentWindowUpdates(t *testing.T, writers int) {
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			_, err := e.in.UpdateWindow(context.Background(), func(cur *inbox.WindowState) (*inbox.WindowState, error) {
				next := *cur
				next.Window += time.Second
				next.PendingWindow, next.PendingSince = 0, nil
				return &next, nil
			})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent UpdateWindow: %v", err)
		}
	}
}

// claimWhile claims a new id and two young ones per transaction until stop
// closes; a young id claimed as new, or a non-transient failure, is an error.
func (e *env) claimWhile(stop <-chan struct{}, w int, young []string) error {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		dup := young[i%len(young)]
		fresh, _, err := e.claimRetrying([]string{fmt.Sprintf("new-%d-%04d", w, i), dup, young[(i*7)%len(young)]})
		if err != nil {
			return err
		}
		if _, ok := fresh[dup]; ok {
			return fmt.Errorf("young id %s was claimed as new during the prune", dup)
		}
	}
}

// prune: ids aged past the window are deleted in batches while other
// transactions claim (new ids and duplicates of young ones) and one holds an
// uncommitted claim; young ids all stay, a hold caps the cutoff, and every
// run is recorded.
func prune(t *testing.T, h Harness) {
	e := setup(t, h)
	c := ctx(t)
	var old, older, young []string
	for i := range 60 {
		old = append(old, fmt.Sprintf("old-%03d", i))
		older = append(older, fmt.Sprintf("older-%03d", i))
		young = append(young, fmt.Sprintf("young-%03d", i))
	}
	tx := e.begin(t)
	e.claim(t, tx, append(append(append([]string{}, old...), older...), young...)...)
	commit(t, tx)
	h.Age(t, e.db, e.schema, inboxTable, old, 90*time.Minute)
	h.Age(t, e.db, e.schema, inboxTable, older, 3*time.Hour)

	// A hold two hours back keeps the ids aged 90 minutes.
	now, _, err := e.in.Progress(c)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.in.PruneTable(c, inbox.Bound{Window: time.Hour, HoldAt: now.Add(-2 * time.Hour), HeldReason: "replica r1 gone",
		HeldSince: now.Add(-time.Minute)}, 7, time.Minute)
	if err != nil || res.RowsDeleted != int64(len(older)) || !res.Cutoff.Before(res.WindowCutoff) {
		t.Fatalf("held prune = %+v, %v; want %d deleted below the hold", res, err, len(older))
	}
	run, err := e.in.LastPruneRun(c)
	if err != nil || run == nil || run.HeldReason != "replica r1 gone" || run.RowsDeleted != int64(len(older)) || run.FinishedAt == nil || run.Window != time.Hour {
		t.Fatalf("LastPruneRun = %+v, %v", run, err)
	}

	// An uncommitted claim is held open while the prune runs: it must not
	// wait for it.
	holder := e.begin(t)
	wantSet(t, "holder", e.claim(t, holder, "held-1", "held-2"), "held-1", "held-2")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	claimErrs := make(chan error, 2)
	for w := range 2 {
		wg.Go(func() { claimErrs <- e.claimWhile(stop, w, young) })
	}
	pc, cancel := context.WithTimeout(c, 30*time.Second)
	defer cancel()
	res, err = e.in.PruneTable(pc, inbox.Bound{Window: time.Hour}, 7, time.Minute)
	close(stop)
	wg.Wait()
	close(claimErrs)
	for err := range claimErrs {
		if err != nil {
			t.Fatalf("claim during the prune: %v", err)
		}
	}
	if err != nil || res.RowsDeleted != int64(len(old)) || !res.Cutoff.Equal(res.WindowCutoff) {
		t.Fatalf("prune = %+v, %v; want the %d ids aged 90 minutes deleted", res, err, len(old))
	}
	commit(t, holder)
	tx = e.begin(t)
	wantSet(t, "pruned ids are new again; young and held ones are not", e.claim(t, tx, old[0], older[0], young[0], "held-1"), old[0], older[0])
	commit(t, tx)
}
