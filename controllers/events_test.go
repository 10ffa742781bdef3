package controllers

import (
	"strings"
	"testing"
	"unicode/utf8"

	"k8s.io/client-go/tools/events"
)

// A new resource's first pass posts one Normal event for the conditions it
// turned True (not one each); later transitions have their own events.
func TestFirstPassPostsOneEvent(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.pass()
	rec := h.r.recorder.(*events.FakeRecorder)
	drain := func() []string {
		var seen []string
		for len(rec.Events) > 0 {
			seen = append(seen, <-rec.Events)
		}
		return seen
	}
	seen := drain()
	if len(seen) != 1 || !containsWith(seen, "Normal Provisioned", "InboxReady: inbox projections.inbox_orders", "; EffectReady: ", "; PruneScheduled: ") {
		t.Fatalf("first pass events %q, want one Normal Provisioned naming InboxReady, EffectReady and PruneScheduled", seen)
	}
	h.markAvailable()
	h.pass()
	if seen := drain(); len(seen) != 1 || !containsWith(seen, "Normal RuntimeDeployed") {
		t.Fatalf("events when the Deployment became available %q, want one Normal RuntimeDeployed", seen)
	}
	long := strings.Repeat("é", maxNote)
	if got := truncateNote(long); len(got) > maxNote || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("truncateNote kept %d bytes (valid UTF-8 %v), want at most %d ending in an ellipsis", len(got), utf8.ValidString(got), maxNote)
	}
}
