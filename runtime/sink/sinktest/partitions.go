package sinktest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// setupLayout is setup in layout, on an inbox the controller claimed for
// owner (so it has an epoch, and on MySQL an epoch marker row).
func setupLayout(t *testing.T, h Harness, layout config.Layout, owner inbox.Owner) (*env, inbox.Identity) {
	t.Helper()
	db, schema := h.Open(t)
	in, err := db.Inbox(config.Sink{Schema: schema, InboxTable: inboxTable, Layout: layout})
	if err != nil {
		t.Fatalf("Inbox(%s): %v", layout, err)
	}
	if got := in.Layout(); got != layout {
		t.Fatalf("Layout() = %s, want %s", got, layout)
	}
	id, err := in.MigrateFor(ctx(t), &inbox.OwnerClaim{Owner: owner})
	if err != nil {
		t.Fatalf("MigrateFor: %v", err)
	}
	return &env{h: h, db: db, schema: schema, in: in}, id
}

// claimPublished claims ids published at the given times in one
// transaction, after EnsurePartitionsFor as the consumer does, retrying
// transient failures; it returns the new ones.
func (e *env) claimPublished(ids []string, published []time.Time) (map[string]struct{}, error) {
	c := context.Background()
	for {
		if err := e.in.EnsurePartitionsFor(c, published); err != nil {
			if class, _ := e.db.Classify(err); class == sink.ClassUnavailable {
				continue
			}
			return nil, fmt.Errorf("EnsurePartitionsFor: %w", err)
		}
		claims := make([]inbox.Claim, len(ids))
		for i, id := range ids {
			claims[i] = inbox.Claim{MessageID: id, PublishedAt: published[i], Fingerprint: int64(len(id))}
		}
		fresh, err := func() (map[string]struct{}, error) {
			tx, err := e.db.Begin(c)
			if err != nil {
				return nil, err
			}
			defer func() { _ = tx.Rollback(c) }()
			fresh, err := e.in.Claim(c, tx, claims)
			if err != nil {
				return nil, err
			}
			return fresh, tx.Commit(c)
		}()
		if err == nil {
			return fresh, nil
		}
		if class, _ := e.db.Classify(err); class != sink.ClassUnavailable {
			return nil, fmt.Errorf("claim failed with a non-transient error (class %d): %w", class, err)
		}
		e.in.ForgetPartitions() // a day may have been pruned meanwhile
	}
}

func (e *env) mustClaimPublished(t *testing.T, day time.Time, ids ...string) map[string]struct{} {
	t.Helper()
	at := make([]time.Time, len(ids))
	for i := range at {
		at[i] = day.Add(time.Hour)
	}
	fresh, err := e.claimPublished(ids, at)
	if err != nil {
		t.Fatal(err)
	}
	return fresh
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// prunePartitioned: whole days below the cutoff are dropped while other
// transactions claim new ids and re-publish (on another day) ids of a kept
// day; a day that holds an id processed after the cutoff (a backlog) is
// kept; no id claimed during the prune is lost, an id of a kept day stays
// deduplicated across partitions, the run is recorded, and the inbox keeps
// its epoch.
func prunePartitioned(t *testing.T, h Harness) {
	owner := inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "parts", UID: "u1"}
	e, id := setupLayout(t, h, config.LayoutPartitioned, owner)
	c := ctx(t)
	now, _, err := e.in.Progress(c)
	if err != nil {
		t.Fatal(err)
	}
	day := func(back int) time.Time { return inbox.Day(now).AddDate(0, 0, -back) }
	if err := e.in.EnsurePartitions(c, day(10), 12); err != nil {
		t.Fatalf("EnsurePartitions: %v", err)
	}
	if err := e.in.EnsurePartitions(c, day(10), 12); err != nil {
		t.Fatalf("EnsurePartitions again: %v", err)
	}
	// With a 72-hour window, the days 4 and more back lie wholly below the
	// cutoff whatever the time of day; the days 3 and fewer back do not.
	old10, old9, old6, backlog, young := names("old10", 20), names("old9", 20), names("old6", 20), names("backlog8", 5), names("young1", 30)
	for _, b := range []struct {
		ids  []string
		back int
	}{{old10, 10}, {old9, 9}, {old6, 6}, {backlog, 8}, {young, 1}} {
		wantSet(t, "first claim", e.mustClaimPublished(t, day(b.back), b.ids...), b.ids...)
	}
	for _, ids := range [][]string{old10, old9, old6} {
		e.h.Age(t, e.db, e.schema, inboxTable, ids, 100*time.Hour)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	claimed := make([][]string, 2)
	for w := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				fresh := fmt.Sprintf("new-%d-%04d", w, i)
				dup := young[(i+w)%len(young)]
				got, err := e.claimPublished([]string{fresh, dup}, []time.Time{now, now})
				if err != nil {
					errs <- err
					return
				}
				if _, ok := got[dup]; ok {
					errs <- fmt.Errorf("id %s of a kept day, re-published today, was claimed as new during the prune", dup)
					return
				}
				if _, ok := got[fresh]; !ok {
					errs <- fmt.Errorf("new id %s was not claimed as new", fresh)
					return
				}
				claimed[w] = append(claimed[w], fresh)
			}
		})
	}
	wg.Go(func() { // another replica making days meanwhile
		e.in.ForgetPartitions()
		errs <- e.in.EnsurePartitions(context.Background(), now, 3)
	})
	res, err := e.in.PrunePartitions(c, inbox.Bound{Window: 72 * time.Hour})
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("during the prune: %v", err)
		}
	}
	if err != nil || res.PartitionsDropped < 3 || res.RowsDeleted != 0 {
		t.Fatalf("PrunePartitions = %+v, %v; want at least the days 10, 9 and 6 back dropped", res, err)
	}
	run, err := e.in.LastPruneRun(c)
	if err != nil || run == nil || run.FinishedAt == nil || run.PartitionsDropped != res.PartitionsDropped || run.Error != "" {
		t.Fatalf("LastPruneRun = %+v, %v", run, err)
	}
	for w, ids := range claimed {
		if len(ids) == 0 {
			t.Fatalf("worker %d claimed nothing during the prune", w)
		}
		if got := e.mustClaimPublished(t, day(0), ids...); len(got) != 0 {
			t.Fatalf("ids claimed during the prune were lost: %v", keys(got))
		}
	}
	wantSet(t, "dropped days' ids are new again; the backlog's and the kept day's are not",
		e.mustClaimPublished(t, day(2), old10[0], old9[0], old6[0], backlog[0], young[0]), old10[0], old9[0], old6[0])
	if _, _, ready, err := e.in.Check(c, inbox.OwnerClaim{Owner: owner, Epoch: id.Epoch}); err != nil || !ready {
		t.Fatalf("Check after the prune = ready %v, %v; want the epoch intact", ready, err)
	}
	// A Partitioned inbox is not pruned row by row.
	if _, err := e.in.PruneTable(c, inbox.Bound{Window: time.Hour}, 10, time.Second); err == nil {
		t.Fatal("PruneTable on a Partitioned inbox succeeded")
	}
}

// partitionedClaims: the same id published on two days is claimed once
// (across partitions), in one batch and in two concurrent transactions.
func partitionedClaims(t *testing.T, h Harness) {
	e, _ := setupLayout(t, h, config.LayoutPartitioned, inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "dedup", UID: "u1"})
	now := time.Now()
	yesterday := now.AddDate(0, 0, -1)
	fresh, err := e.claimPublished([]string{"a", "a", "b"}, []time.Time{yesterday, now, now})
	if err != nil {
		t.Fatal(err)
	}
	wantSet(t, "first claims", fresh, "a", "b")
	wantSet(t, "a and b re-published on other days", e.mustClaimPublished(t, inbox.Day(now).AddDate(0, 0, -3), "a", "b", "c"), "c")
	for round := range 20 {
		id := fmt.Sprintf("race-%02d", round)
		var wg sync.WaitGroup
		got := make([]map[string]struct{}, 2)
		errs := make([]error, 2)
		for w := range 2 {
			wg.Go(func() { got[w], errs[w] = e.claimPublished([]string{id}, []time.Time{now.AddDate(0, 0, -w)}) })
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("concurrent claims: %v, %v", errs[0], errs[1])
		}
		if n := len(got[0]) + len(got[1]); n != 1 {
			t.Fatalf("id %s published on two days, claimed concurrently: new %d times, want once", id, n)
		}
	}
}
