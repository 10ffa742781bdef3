package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// windowInput is one input of the window formula.
type windowInput struct {
	// Name is the formula's symbol (L, A, O, R_redeliver, R_replay,
	// safetyMargin, maxReplayAge, window).
	Name  string `json:"name"`
	Value string `json:"value"`
	// Meaning says what the input is, in words.
	Meaning string `json:"meaning"`
	// From is where it was read: the broker (with the setting), or the
	// spec field.
	From string `json:"from"`
	// Deciding marks the input that set the window.
	Deciding bool `json:"deciding,omitempty"`
}

// windowFact is one item of status.retention.derivedFrom.
type windowFact struct {
	Fact   string `json:"fact"`
	Origin string `json:"origin,omitempty"`
}

// windowExplanation is what `explain-window` prints.
type windowExplanation struct {
	Window  string `json:"window,omitempty"`
	Mode    string `json:"mode"`
	Formula string `json:"formula"`
	// Decided names the deciding input and says why, in words.
	Decided string        `json:"decided"`
	Inputs  []windowInput `json:"inputs"`
	// Facts are the broker's and the spec's settings as the controller
	// read them (status.retention.derivedFrom).
	Facts      []windowFact `json:"facts,omitempty"`
	Pending    string       `json:"pending,omitempty"`
	ObservedAt *time.Time   `json:"observedAt,omitempty"`
	Resolved   string       `json:"resolved,omitempty"`
}

const formula = "W = max(R_redeliver, R_replay) + safetyMargin, R_redeliver = min(L, A + O)"

// calcRE reads the formula's own item of derivedFrom (runtime/retention).
var calcRE = regexp.MustCompile(`^L=(\S+) A=(\S+) R_redeliver=min\(L,A\+O\)=(\S+) R_replay=(\S+)(?: \((.*)\))?$`)

// splitFacts splits derivedFrom into its items, each with the origin its
// parenthesised suffix names ("(broker)", "(spec)", "(queue argument ...)").
func splitFacts(derivedFrom string) []windowFact {
	var out []windowFact
	for _, item := range strings.Split(derivedFrom, "; ") {
		if item == "" {
			continue
		}
		f := windowFact{Fact: item}
		if strings.HasSuffix(item, ")") {
			if i := strings.LastIndex(item, " ("); i > 0 {
				f.Fact, f.Origin = item[:i], item[i+2:len(item)-1]
			}
		}
		out = append(out, f)
	}
	return out
}

// horizon parses a horizon of status ("48h", "∞").
func horizon(s string) (retention.Horizon, bool) {
	if s == "∞" {
		return retention.Infinite(), true
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return retention.Horizon{}, false
	}
	return retention.Finite(d), true
}

// fromBroker is the From of an input read from the broker; the settings
// themselves are listed with the facts.
const fromBroker = "the broker (settings below)"

// explainWindow explains status.retention: each input, where it came from,
// and which one decided. It is pure.
func explainWindow(idc *v1alpha1.IdempotentConsumer) windowExplanation {
	r := idc.Status.Retention
	spec := idc.Spec.Retention
	ex := windowExplanation{Mode: string(spec.Mode), Formula: formula}
	if ex.Mode == "" {
		ex.Mode = "Derived"
	}
	if c := meta.FindStatusCondition(idc.Status.Conditions, v1alpha1.ConditionRetentionResolved); c != nil && c.Status != "True" {
		ex.Resolved = fmt.Sprintf("RetentionResolved=%s (%s): %s", c.Status, c.Reason, c.Message)
	}
	if r == nil || r.Window == "" {
		ex.Decided = "no window is known yet: nothing is pruned until it is"
		if ex.Resolved != "" {
			ex.Decided += "; " + ex.Resolved
		}
		if r != nil {
			ex.Facts = splitFacts(r.DerivedFrom)
		}
		return ex
	}
	ex.Window = r.Window
	ex.Facts = splitFacts(r.DerivedFrom)
	if r.ObservedAt != nil {
		t := r.ObservedAt.UTC()
		ex.ObservedAt = &t
	}
	if r.PendingWindow != "" {
		since := ""
		if r.PendingSince != nil {
			since = " since " + r.PendingSince.UTC().Format(time.RFC3339)
		}
		ex.Pending = fmt.Sprintf("a smaller window %s was derived%s; it is adopted once the current window %s has elapsed (ids processed under the old one may still be redelivered until then)", r.PendingWindow, since, r.Window)
	}
	if ex.Mode == "Explicit" || (r.RedeliveryHorizon == "" && r.ReplayHorizon == "") {
		ex.Formula = "W = spec.retention.window (mode Explicit: the broker is not read)"
		ex.Inputs = []windowInput{{Name: "window", Value: r.Window, Meaning: "the declared window", From: "spec.retention.window", Deciding: true}}
		ex.Decided = fmt.Sprintf("window %s is spec.retention.window (mode Explicit)", r.Window)
		return ex
	}
	explainDerived(&ex, idc)
	return ex
}

func explainDerived(ex *windowExplanation, idc *v1alpha1.IdempotentConsumer) {
	r, spec := idc.Status.Retention, idc.Spec.Retention
	var l, a, bounded string
	for _, f := range ex.Facts {
		if m := calcRE.FindStringSubmatch(f.Fact + originSuffix(f)); m != nil {
			l, a, bounded = m[1], m[2], m[5]
		}
	}
	broker := fromBroker
	o := orDefault(string(spec.MaxConsumerOutage), "(default)")
	margin := orDefault(string(spec.SafetyMargin), "(default)")
	rd := windowInput{Name: "R_redeliver", Value: r.RedeliveryHorizon, Meaning: "how long the broker may still redeliver a message: min(L, A + O)", From: "computed"}
	rp := windowInput{Name: "R_replay", Value: r.ReplayHorizon, Meaning: "how far back a reset, seek or redrive can reach", From: broker}
	inL := windowInput{Name: "L", Value: l, Meaning: "the longest an undelivered message lives on the broker", From: broker}
	inA := windowInput{Name: "A", Value: a, Meaning: "the attempts bound: the sum of lease + backoff over the delivery attempts", From: broker}
	inO := windowInput{Name: "O", Value: o, Meaning: "the longest consumer outage to survive", From: "spec.retention.maxConsumerOutage"}
	inM := windowInput{Name: "safetyMargin", Value: margin, Meaning: "added to the larger horizon", From: "spec.retention.safetyMargin"}
	if bounded != "" {
		rd.From = "computed; " + bounded + " (spec.retention.maxReplayAge " + string(spec.MaxReplayAge) + ")"
		if strings.Contains(bounded, "R_replay") {
			rp.From = "spec.retention.maxReplayAge, standing in for an unbounded broker horizon"
		}
	}
	hd, okD := horizon(r.RedeliveryHorizon)
	hp, okP := horizon(r.ReplayHorizon)
	var why, larger string
	switch {
	case !okD || !okP:
		why, larger = "the horizons in status could not be read", "?"
	case hd.Less(hp):
		rp.Deciding, larger = true, r.ReplayHorizon
		why = fmt.Sprintf("R_replay decided: the replay reach %s is longer than redelivery %s", r.ReplayHorizon, r.RedeliveryHorizon)
	case hp.Less(hd):
		rd.Deciding, larger = true, r.RedeliveryHorizon
		why = fmt.Sprintf("R_redeliver decided: redelivery %s is longer than the replay reach %s", r.RedeliveryHorizon, r.ReplayHorizon)
	default:
		rd.Deciding, rp.Deciding, larger = true, true, r.ReplayHorizon
		why = fmt.Sprintf("R_redeliver and R_replay tie at %s", r.ReplayHorizon)
	}
	if rd.Deciding && bounded == "" {
		why += ", and within it " + redeliveryDecider(&inL, &inA, &inO)
	}
	ex.Inputs = []windowInput{inL, inA, inO, rd, rp, inM}
	if spec.MaxReplayAge != "" {
		ex.Inputs = append(ex.Inputs, windowInput{Name: "maxReplayAge", Value: string(spec.MaxReplayAge),
			Meaning: "bounds a horizon the broker leaves unbounded", From: "spec.retention.maxReplayAge", Deciding: bounded != ""})
	}
	ex.Decided = fmt.Sprintf("%s; window %s = %s + safetyMargin %s (source: %s)", why, r.Window, larger, margin, r.Source)
}

// redeliveryDecider says whether L or A + O set R_redeliver = min(L, A + O).
func redeliveryDecider(l, a, o *windowInput) string {
	hl, okL := horizon(l.Value)
	ha, okA := horizon(a.Value)
	ho, okO := horizon(strings.TrimSuffix(o.Value, " (default)"))
	if !okL || !okA {
		return "L and A are not in derivedFrom"
	}
	if !okO {
		ho = retention.Finite(0)
	}
	ao := ha.Plus(ho)
	if hl.Less(ao) || hl == ao {
		l.Deciding = true
		return fmt.Sprintf("L decided (the message life %s is shorter than A + O = %s)", l.Value, ao)
	}
	a.Deciding, o.Deciding = true, true
	return fmt.Sprintf("A + O decided (%s + %s = %s, shorter than the message life %s)", a.Value, o.Value, ao, l.Value)
}

func originSuffix(f windowFact) string {
	if f.Origin == "" || f.Origin == "spec" || f.Origin == "broker" {
		return ""
	}
	return " (" + f.Origin + ")"
}

func orDefault(v, dflt string) string {
	if v == "" {
		return dflt
	}
	return v
}

func (a *app) explainWindowCommand() *cobra.Command {
	cmd := a.nameCommand("explain-window NAME", "Each input of the retention window, where it was read, and which one decided",
		func(_ context.Context, _ *clients, idc *v1alpha1.IdempotentConsumer) error {
			ex := explainWindow(idc)
			return a.print(ex, func(w io.Writer) error { return renderExplanation(w, ex) })
		})
	return cmd
}

func renderExplanation(w io.Writer, ex windowExplanation) error {
	p := &printer{w: w}
	p.f("Window:   %s (mode %s)\n", orDefault(ex.Window, "unknown"), ex.Mode)
	p.f("Formula:  %s\n", ex.Formula)
	p.f("Decided:  %s\n", ex.Decided)
	if ex.Pending != "" {
		p.f("Pending:  %s\n", ex.Pending)
	}
	if ex.Resolved != "" {
		p.f("Resolved: %s\n", ex.Resolved)
	}
	if ex.ObservedAt != nil {
		p.f("Observed: %s\n", ex.ObservedAt.Format(time.RFC3339))
	}
	if len(ex.Inputs) > 0 {
		p.f("\n")
		tw := p.table()
		p.tf(tw, "INPUT\tVALUE\tDECIDING\tFROM\tMEANING\n")
		for _, in := range ex.Inputs {
			mark := ""
			if in.Deciding {
				mark = "<- decided"
			}
			p.tf(tw, "%s\t%s\t%s\t%s\t%s\n", in.Name, orDefault(in.Value, "-"), mark, in.From, in.Meaning)
		}
		p.flush(tw)
	}
	if len(ex.Facts) > 0 {
		p.f("\nRead by the controller (status.retention.derivedFrom):\n")
		for _, f := range ex.Facts {
			if f.Origin != "" {
				p.f("  - %s [%s]\n", f.Fact, f.Origin)
			} else {
				p.f("  - %s\n", f.Fact)
			}
		}
	}
	return p.err
}
