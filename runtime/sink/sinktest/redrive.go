package sinktest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// seedDeadLetters writes a (evaluation, a long reason), b (database) and c
// (no class: read from its reason, http) and returns their ids, oldest
// first.
func (e *env) seedDeadLetters(t *testing.T) (a, b, c int64) {
	t.Helper()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tx := e.begin(t)
	if _, err := e.in.DeadLetter(ctx(t), tx, []inbox.DeadLetter{
		{MessageID: "a", NativeID: "na", Reason: "évaluation failed: " + strings.Repeat("x", 50), Class: "evaluation",
			Payload: []byte(`{"a":1}`), Headers: map[string]string{"k": "v"}, Attempts: 3, PublishedAt: at},
		{MessageID: "b", NativeID: "nb", Reason: "database: boom", Class: "database", Payload: []byte("b"), Attempts: 1},
		{MessageID: "c", NativeID: "nc", Reason: "http: 500 from the endpoint", Payload: []byte("c")},
	}); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	commit(t, tx)
	ids, err := e.in.SelectDeadLetters(ctx(t), inbox.DeadLetterFilter{})
	if err != nil || len(ids) != 3 || !slices.IsSorted(ids) {
		t.Fatalf("SelectDeadLetters() = %v, %v; want 3 ids, oldest first", ids, err)
	}
	return ids[0], ids[1], ids[2]
}

// deadLetterListing: the filter (classes, the class read from the reason
// when none was recorded, message ids, dead_at bounds, limit), the excerpt
// and the total before the limit.
func deadLetterListing(t *testing.T, h Harness) {
	e := setup(t, h)
	c := ctx(t)
	a, b, cc := e.seedDeadLetters(t)
	past, future := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	for _, tc := range []struct {
		what string
		f    inbox.DeadLetterFilter
		want []int64
	}{
		{"class", inbox.DeadLetterFilter{Classes: []string{"database", "http"}}, []int64{b, cc}},
		{"message ids", inbox.DeadLetterFilter{MessageIDs: []string{"a", "c", "zz"}}, []int64{a, cc}},
		{"since", inbox.DeadLetterFilter{Since: past}, []int64{a, b, cc}},
		{"until", inbox.DeadLetterFilter{Until: past}, nil},
		{"since and until", inbox.DeadLetterFilter{Since: past, Until: future, Classes: []string{"evaluation"}}, []int64{a}},
		{"limit", inbox.DeadLetterFilter{Limit: 2}, []int64{a, b}},
	} {
		got, err := e.in.SelectDeadLetters(c, tc.f)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("SelectDeadLetters(%s) = %v, %v; want %v", tc.what, got, err, tc.want)
		}
	}
	list, err := e.in.ListDeadLetters(c, inbox.DeadLetterFilter{Limit: 2}, 10)
	if err != nil || list.Total != 3 || len(list.DeadLetters) != 2 {
		t.Fatalf("ListDeadLetters(limit 2) = %+v, %v; want total 3, 2 rows", list, err)
	}
	first := list.DeadLetters[0]
	if first.ID != a || first.MessageID != "a" || first.NativeID != "na" || first.ReasonClass != "evaluation" ||
		first.Reason != "évaluation" || !first.ReasonTruncated || first.Attempts != 3 || first.DeadAt.IsZero() ||
		first.PublishedAt == nil || !first.PublishedAt.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("first listed = %+v", first)
	}
	if second := list.DeadLetters[1]; second.Reason != "database: " || second.PublishedAt != nil {
		t.Errorf("second listed = %+v", second)
	}
	list, err = e.in.ListDeadLetters(c, inbox.DeadLetterFilter{Classes: []string{"http"}}, 100)
	if err != nil || list.Total != 1 || list.DeadLetters[0].ID != cc || list.DeadLetters[0].ReasonClass != "http" ||
		list.DeadLetters[0].ReasonTruncated || list.DeadLetters[0].Attempts != 0 {
		t.Errorf("ListDeadLetters(http) = %+v, %v; want c, its class read from the reason", list, err)
	}
	// The class read from the reason is case-sensitive, as written.
	tx := e.begin(t)
	if _, err := e.in.DeadLetter(c, tx, []inbox.DeadLetter{{MessageID: "d", NativeID: "nd", Reason: "HTTP: not the runtime's text"}}); err != nil {
		t.Fatal(err)
	}
	commit(t, tx)
	if ids, err := e.in.SelectDeadLetters(c, inbox.DeadLetterFilter{Classes: []string{"http"}}); err != nil || !slices.Equal(ids, []int64{cc}) {
		t.Errorf("SelectDeadLetters(http) = %v, %v; want c alone (the class reads the reason case-sensitively)", ids, err)
	}
	if ids, err := e.in.SelectDeadLetters(c, inbox.DeadLetterFilter{Classes: []string{"evaluation"}}); err != nil || len(ids) != 2 || ids[0] != a {
		t.Errorf("SelectDeadLetters(evaluation) = %v, %v; want a and d", ids, err)
	}
	if list, err := e.in.ListDeadLetters(c, inbox.DeadLetterFilter{Classes: []string{"missing_id"}}, 100); err != nil ||
		list.Total != 0 || list.DeadLetters == nil || len(list.DeadLetters) != 0 {
		t.Errorf("ListDeadLetters(nothing) = %+v, %v; want an empty list", list, err)
	}
	if _, err := e.in.ListDeadLetters(c, inbox.DeadLetterFilter{}, 0); err == nil {
		t.Error("ListDeadLetters with excerpt 0 succeeded")
	}
}

// redrive: the primitives that make a redrive exactly once. A locked dead
// letter is skipped by a second redrive (nil, at once), the delete and the
// record commit together (or not at all), and a settled one is gone for
// the next redrive.
func redrive(t *testing.T, h Harness) {
	e := setupWith(t, h, inbox.WithRedrives())
	c := ctx(t)
	a, b, cc := e.seedDeadLetters(t)

	first := e.begin(t)
	d, err := e.in.LockDeadLetter(c, first, a)
	if err != nil || d == nil {
		t.Fatalf("LockDeadLetter(a) = %v, %v", d, err)
	}
	if d.ID != a || d.MessageID != "a" || d.NativeID != "na" || d.Class != "evaluation" || string(d.Payload) != `{"a":1}` ||
		d.Headers["k"] != "v" || d.Attempts != 3 || d.DeadAt.IsZero() || !d.PublishedAt.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Fatalf("locked dead letter = %+v", d)
	}
	second := e.begin(t)
	if other, err := e.in.LockDeadLetter(c, second, a); err != nil || other != nil {
		t.Fatalf("LockDeadLetter(a) by a second redrive = %+v, %v; want nil (locked)", other, err)
	}
	// The second redrive takes b instead, which fails again.
	if got, err := e.in.LockDeadLetter(c, second, b); err != nil || got == nil || got.Class != "database" {
		t.Fatalf("LockDeadLetter(b) = %+v, %v", got, err)
	}
	if err := e.in.FailDeadLetterAgain(c, second, b, "database: again", ""); err != nil {
		t.Fatalf("FailDeadLetterAgain: %v", err)
	}
	if err := e.in.RecordRedrive(c, second, inbox.Redrive{Run: "r1", DeadLetterID: b, MessageID: "b", Outcome: "failed", Reason: "database: again"}); err != nil {
		t.Fatalf("RecordRedrive: %v", err)
	}
	commit(t, second)

	if err := e.in.DeleteDeadLetter(c, first, a); err != nil {
		t.Fatalf("DeleteDeadLetter: %v", err)
	}
	if err := e.in.RecordRedrive(c, first, inbox.Redrive{Run: "r1", DeadLetterID: a, MessageID: "a", Outcome: "redriven"}); err != nil {
		t.Fatalf("RecordRedrive: %v", err)
	}
	commit(t, first)

	tx := e.begin(t)
	if gone, err := e.in.LockDeadLetter(c, tx, a); err != nil || gone != nil {
		t.Fatalf("LockDeadLetter(a) after its redrive = %+v, %v; want nil (gone)", gone, err)
	}
	again, err := e.in.LockDeadLetter(c, tx, b)
	if err != nil || again == nil || again.Attempts != 2 || again.Reason != "database: again" || again.Class != "database" {
		t.Fatalf("b after failing again = %+v, %v; want 2 attempts, the new reason, the class read from it", again, err)
	}
	// A redrive that rolls back settles nothing.
	if err := e.in.DeleteDeadLetter(c, tx, b); err != nil {
		t.Fatal(err)
	}
	if err := e.in.RecordRedrive(c, tx, inbox.Redrive{Run: "r1", DeadLetterID: b, Outcome: "redriven"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(c); err != nil {
		t.Fatal(err)
	}
	if ids, err := e.in.SelectDeadLetters(c, inbox.DeadLetterFilter{}); err != nil || !slices.Equal(ids, []int64{b, cc}) {
		t.Fatalf("dead letters after the redrives = %v, %v; want [b c]", ids, err)
	}
	sum, err := e.in.RedriveSummary(c, "r1")
	if err != nil || sum.Run != "r1" || sum.Total() != 2 || sum.Outcomes["redriven"] != 1 || sum.Outcomes["failed"] != 1 || sum.Last.IsZero() {
		t.Fatalf("RedriveSummary(r1) = %+v, %v; want 1 redriven, 1 failed", sum, err)
	}
	if sum, err := e.in.RedriveSummary(c, "r2"); err != nil || sum.Total() != 0 || !sum.Last.IsZero() {
		t.Fatalf("RedriveSummary(r2) = %+v, %v; want nothing", sum, err)
	}
}

// concurrentRedrives: redrives of one run race over the same dead letters
// (each selects them all, then locks, deletes and records one at a time).
// Each dead letter is settled exactly once: the summary counts each once
// and none is left.
func concurrentRedrives(t *testing.T, h Harness) {
	e := setupWith(t, h, inbox.WithRedrives())
	const n, workers = 40, 4
	dls := make([]inbox.DeadLetter, n)
	for i := range dls {
		dls[i] = inbox.DeadLetter{MessageID: fmt.Sprintf("m%02d", i), NativeID: fmt.Sprintf("n%02d", i), Reason: "database: x", Class: "database"}
	}
	tx := e.begin(t)
	if _, err := e.in.DeadLetter(ctx(t), tx, dls); err != nil {
		t.Fatal(err)
	}
	commit(t, tx)
	var mu sync.Mutex
	settled := map[int64]int{}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			c := context.Background()
			ids, err := e.in.SelectDeadLetters(c, inbox.DeadLetterFilter{})
			if err != nil {
				errs <- err
				return
			}
			for _, id := range ids {
				got, err := e.redriveOne(c, id)
				for err != nil {
					if class, _ := e.db.Classify(err); class != sink.ClassUnavailable {
						break
					}
					got, err = e.redriveOne(c, id) // transient: as the redrive, again
				}
				if err != nil {
					errs <- err
					return
				}
				if got {
					mu.Lock()
					settled[id]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for id, k := range settled {
		if k != 1 {
			t.Errorf("dead letter %d settled %d times", id, k)
		}
	}
	sum, err := e.in.RedriveSummary(ctx(t), "race")
	if err != nil || len(settled) != n || sum.Outcomes["redriven"] != n || sum.Total() != n {
		t.Fatalf("%d settled, summary %+v (%v); want each of %d once", len(settled), sum, err, n)
	}
	if left, err := e.in.SelectDeadLetters(ctx(t), inbox.DeadLetterFilter{}); err != nil || len(left) != 0 {
		t.Fatalf("dead letters left: %v, %v", left, err)
	}
}

// redriveOne settles dead letter id in one transaction; false when another
// redrive has it or had it.
func (e *env) redriveOne(c context.Context, id int64) (bool, error) {
	tx, err := e.db.Begin(c)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(c) }()
	d, err := e.in.LockDeadLetter(c, tx, id)
	if err != nil || d == nil {
		return false, err
	}
	if err := e.in.DeleteDeadLetter(c, tx, id); err != nil {
		return false, err
	}
	if err := e.in.RecordRedrive(c, tx, inbox.Redrive{Run: "race", DeadLetterID: id, MessageID: d.MessageID, Outcome: "redriven"}); err != nil {
		return false, err
	}
	return true, tx.Commit(c)
}
