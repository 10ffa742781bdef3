package main

import (
	"strings"
	"testing"

	"github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

func TestExplainWindowNamesTheDecidingInput(t *testing.T) {
	calc := func(l, a, rd, rp, note string) string {
		s := "stream S max_age=" + l + " retention=limits (broker); consumer c ack_wait=30s max_deliver=5 backoff=[] (broker); maxConsumerOutage=20m (spec); safetyMargin=1h (spec); maxReplayAge unset (spec); " +
			"L=" + l + " A=" + a + " R_redeliver=min(L,A+O)=" + rd + " R_replay=" + rp
		if note != "" {
			s += " (" + note + ")"
		}
		return s
	}
	for _, tc := range []struct {
		name     string
		mutate   func(*v1alpha1.IdempotentConsumer)
		deciding []string
		decided  string
	}{
		{name: "replay decides", mutate: func(*v1alpha1.IdempotentConsumer) {}, deciding: []string{"R_replay"},
			decided: "R_replay decided: the replay reach 48h is longer than redelivery 25m; window 49h = 48h + safetyMargin 1h (source: Broker)"},
		{name: "A + O decides within redelivery", mutate: func(idc *v1alpha1.IdempotentConsumer) {
			r := idc.Status.Retention
			r.Window, r.RedeliveryHorizon, r.ReplayHorizon = "3h", "2h", "1h"
			r.DerivedFrom = calc("72h", "1h40m", "2h", "1h", "")
		}, deciding: []string{"A", "O", "R_redeliver"}, decided: "A + O decided (1h40m + 20m = 2h, shorter than the message life 72h)"},
		{name: "L decides within redelivery", mutate: func(idc *v1alpha1.IdempotentConsumer) {
			r := idc.Status.Retention
			r.Window, r.RedeliveryHorizon, r.ReplayHorizon = "7h", "6h", "1h"
			r.DerivedFrom = calc("6h", "∞", "6h", "1h", "")
		}, deciding: []string{"L", "R_redeliver"}, decided: "L decided (the message life 6h is shorter than A + O = ∞)"},
		{name: "maxReplayAge stands in", mutate: func(idc *v1alpha1.IdempotentConsumer) {
			idc.Spec.Retention.MaxReplayAge = "72h"
			r := idc.Status.Retention
			r.Window, r.RedeliveryHorizon, r.ReplayHorizon, r.Source = "73h", "25m", "72h", v1alpha1.RetentionSourceDeclared
			r.DerivedFrom = calc("48h", "5m", "25m", "∞", "R_replay=∞ bounded by maxReplayAge")
		}, deciding: []string{"R_replay", "maxReplayAge"}, decided: "(source: Declared)"},
		{name: "explicit", mutate: func(idc *v1alpha1.IdempotentConsumer) {
			idc.Spec.Retention.Mode = "Explicit"
			idc.Status.Retention = &v1alpha1.RetentionStatus{Window: "168h", Source: v1alpha1.RetentionSourceDeclared, DerivedFrom: "mode=Explicit (spec); window=168h (spec); broker not read"}
		}, deciding: []string{"window"}, decided: "window 168h is spec.retention.window (mode Explicit)"},
		{name: "unresolved", mutate: func(idc *v1alpha1.IdempotentConsumer) {
			idc.Status.Retention = nil
			idc.Status.Conditions[1].Status, idc.Status.Conditions[1].Reason, idc.Status.Conditions[1].Message = "False", "UnboundedReplay", "the broker can replay without bound"
		}, deciding: nil, decided: "no window is known yet: nothing is pruned until it is; RetentionResolved=False (UnboundedReplay): the broker can replay without bound"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idc := orders()
			tc.mutate(idc)
			ex := explainWindow(idc)
			var deciding []string
			for _, in := range ex.Inputs {
				if in.Deciding {
					deciding = append(deciding, in.Name)
				}
			}
			if strings.Join(deciding, ",") != strings.Join(tc.deciding, ",") {
				t.Errorf("deciding inputs %v, want %v (%+v)", deciding, tc.deciding, ex.Inputs)
			}
			if !strings.Contains(ex.Decided, tc.decided) {
				t.Errorf("decided %q, want it to contain %q", ex.Decided, tc.decided)
			}
		})
	}
}

func TestExplainWindowTellsWhereEachInputCameFrom(t *testing.T) {
	h := newHarness(orders())
	code, out, stderr := h.run(t, "explain-window", "orders")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	norm := strings.Join(strings.Fields(out), " ")
	for _, want := range []string{
		"Window: 49h (mode Derived)",
		"Formula: W = max(R_redeliver, R_replay) + safetyMargin, R_redeliver = min(L, A + O)",
		"R_replay 48h <- decided the broker (settings below)",
		"O 20m spec.retention.maxConsumerOutage",
		"safetyMargin 1h spec.retention.safetyMargin",
		"- stream ORDERS max_age=48h retention=limits [broker]",
		"- L=48h A=5m R_redeliver=min(L,A+O)=25m R_replay=48h",
	} {
		if !strings.Contains(norm, want) {
			t.Errorf("explain-window lacks %q:\n%s", want, out)
		}
	}
}
