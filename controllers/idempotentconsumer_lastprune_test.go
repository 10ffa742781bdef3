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
