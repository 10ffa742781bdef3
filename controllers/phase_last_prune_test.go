package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// An inbox whose latest prune run is older than the one status recorded was
// restored from an earlier backup; the same run, a later one, or one still
// running since are not.
func TestOlderThanRecorded(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	recorded := &messagingv1alpha1.PruneRunStatus{Time: &metav1.Time{Time: at}}
	finished := func(d time.Duration) *inbox.PruneRun {
		f := at.Add(d)
		return &inbox.PruneRun{StartedAt: f.Add(-time.Minute), FinishedAt: &f}
	}
	for _, tc := range []struct {
		name     string
		run      *inbox.PruneRun
		recorded *messagingv1alpha1.PruneRunStatus
		want     bool
	}{
		{"nothing recorded yet", nil, nil, false},
		{"the recorded run, to the nanosecond", finished(400 * time.Millisecond), recorded, false},
		{"a later run", finished(30 * time.Minute), recorded, false},
		{"a run started since, still running", &inbox.PruneRun{StartedAt: at.Add(30 * time.Minute)}, recorded, false},
		{"an earlier run", finished(-30 * time.Minute), recorded, true},
		{"no run any more", nil, recorded, true},
	} {
		if got := olderThanRecorded(tc.run, tc.recorded); got != tc.want {
			t.Errorf("%s: olderThanRecorded = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestLastPruneStatusHeldBack(t *testing.T) {
	finished := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	since := finished.Add(-3 * time.Hour)
	run := &inbox.PruneRun{FinishedAt: &finished, Cutoff: since.Add(-5 * time.Second), WindowCutoff: finished.Add(-time.Minute),
		RowsDeleted: 7, HeldReason: "replica r-1 stopped without acknowledging everything it committed", HeldSince: &since}
	st := lastPruneStatus(run)
	if st.HeldBack != run.HeldReason || st.HeldSince == nil || !st.HeldSince.Time.Equal(since) ||
		st.WindowCutoff == nil || !st.WindowCutoff.Time.Equal(run.WindowCutoff) || st.RowsDeleted != 7 {
		t.Fatalf("status %+v for run %+v", st, run)
	}
	if got := heldBackSeconds(st, finished.Add(time.Hour)); got != (4 * time.Hour).Seconds() {
		t.Errorf("held back %v s, want %v", got, (4 * time.Hour).Seconds())
	}
	plain := &inbox.PruneRun{FinishedAt: &finished, Cutoff: finished.Add(-time.Minute), WindowCutoff: finished.Add(-time.Minute)}
	st = lastPruneStatus(plain)
	if st.HeldBack != "" || st.HeldSince != nil || st.WindowCutoff != nil {
		t.Errorf("a run not held back shows %+v", st)
	}
	if got := heldBackSeconds(st, finished); got != 0 {
		t.Errorf("held back %v s for a run not held back", got)
	}
}
