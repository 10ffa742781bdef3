package controllers

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

func TestAdoptWithoutStoreNeverShrinks(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	small := retention.Result{Window: time.Hour, InputsHash: "small"}
	pending := &retention.Applied{InForce: retention.Result{Window: 24 * time.Hour, InputsHash: "big"},
		Pending: &small, ShrinkObservedAt: t0}

	// Status says the old window has elapsed: the pure rule would adopt 1h,
	// but without the stored state the larger window stays.
	next, isPending := adoptWithoutStore(pending, small, t0.Add(25*time.Hour))
	if !isPending || next.InForce.Window != 24*time.Hour || next.Pending.Window != time.Hour || !next.ShrinkObservedAt.Equal(t0) {
		t.Fatalf("got %+v pending %v; want 24h in force with 1h pending since %s", next, isPending, t0)
	}
	// Growth still applies at once, and with nothing in status the derived
	// window applies.
	if next, isPending = adoptWithoutStore(pending, retention.Result{Window: 48 * time.Hour}, t0); isPending || next.InForce.Window != 48*time.Hour {
		t.Fatalf("growth: %+v pending %v", next, isPending)
	}
	if next, isPending = adoptWithoutStore(nil, small, t0); isPending || next.InForce.Window != time.Hour {
		t.Fatalf("first window: %+v pending %v", next, isPending)
	}
}

func TestProjectRetention(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	a := retention.Applied{InForce: retention.Result{Window: 24 * time.Hour, InputsHash: "h", Source: retention.SourceDeclared,
		DerivedFrom: "spec.retention.window"}, Pending: &retention.Result{Window: time.Hour}, ShrinkObservedAt: t0}
	st := projectRetention(a, time.Time{})
	if st.Window != "24h" || st.PendingWindow != "1h" || st.PendingSince == nil || !st.PendingSince.Time.Equal(t0) ||
		st.InputsHash != "h" || st.Source != "Declared" || st.DerivedFrom != "spec.retention.window" || st.ObservedAt != nil {
		t.Fatalf("projection %+v", st)
	}
	if st = projectRetention(retention.Applied{InForce: a.InForce}, t0); st.PendingWindow != "" || st.PendingSince != nil || st.ObservedAt == nil {
		t.Fatalf("projection without a pending shrink %+v", st)
	}
}

// An unbounded replay stalls, and reading the same unbounded broker again
// writes nothing.
func TestUnboundedReplayReadAgainWritesNothing(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.broker.err = fmt.Errorf("%w: stream ORDERS max_age=0", retention.ErrUnboundedReplay)
	idc, _ := h.pass()
	if got := conditionOf(idc, messagingv1alpha1.ConditionStalled); got != "True/UnboundedReplay" {
		t.Fatalf("Stalled = %s, want True/UnboundedReplay", got)
	}
	patches, _ := h.counts()
	h.clk.Step(fakePeriod)
	h.pass()
	if h.broker.readCount() != 2 {
		t.Fatalf("%d reads, want 2", h.broker.readCount())
	}
	if p, _ := h.counts(); p != patches {
		t.Fatalf("a second read of the same unbounded broker wrote %d status patches, want none", p-patches)
	}
}

// A stream that does not partition its subjects as partitions says: the
// retention condition names it (not an unreachable broker), with the
// runtime's actionable text, and the reading is retried at --recheck-period.
func TestStreamNotPartitionedIsNamed(t *testing.T) {
	idc := unitConsumer()
	idc.Spec.Source.NATSJetStream.Partitions = ptr.To(int32(4))
	h := newHarness(t, idc)
	h.broker.err = fmt.Errorf("%w: %w: JetStream stream ORDERS has no subject transform; add one, e.g. nats stream edit ORDERS ...", retention.ErrSourceNotFound, retention.ErrNotPartitioned)
	got, next := h.pass()
	cond := meta.FindStatusCondition(got.Status.Conditions, messagingv1alpha1.ConditionRetentionResolved)
	if cond == nil || cond.Reason != messagingv1alpha1.ReasonStreamNotPartitioned || !strings.Contains(cond.Message, "nats stream edit ORDERS") {
		t.Fatalf("RetentionResolved %+v, want reason StreamNotPartitioned with what to run", cond)
	}
	if next > DefaultRecheckPeriod {
		t.Fatalf("next pass in %s, want within --recheck-period %s", next, DefaultRecheckPeriod)
	}
	if st := meta.FindStatusCondition(got.Status.Conditions, messagingv1alpha1.ConditionStalled); st == nil || st.Status != metav1.ConditionTrue || st.Reason != messagingv1alpha1.ReasonStreamNotPartitioned {
		t.Fatalf("Stalled %+v, want True/StreamNotPartitioned: the stream's owner must act", st)
	}
}
