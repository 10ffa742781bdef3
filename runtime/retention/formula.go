// Package retention derives how long processed message ids must stay in the
// inbox: the dedup window. It reads the broker's redelivery and replay
// settings live (one Inspector per source kind) and applies the formula of
// DESIGN.md section 6:
//
//	R_redeliver = min(L, A + O)
//	W           = max(R_redeliver, R_replay) + safetyMargin
//
// where L is the longest life of an undelivered message on the broker, A the
// attempts bound (Σ of lease + backoff over the attempts), O the declared
// maximum consumer outage and R_replay how far back a reset, seek or redrive
// can reach. Both the controller and the `idc-runtime prune` job call Derive.
package retention

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// Retention modes (config.Retention.Mode).
const (
	ModeDerived  = "Derived"
	ModeExplicit = "Explicit"
)

// SourceKind says where the window's deciding input came from.
type SourceKind string

const (
	// SourceBroker: the deciding horizon was read live from the broker.
	SourceBroker SourceKind = "Broker"
	// SourceDeclared: the window comes from the spec (Explicit mode, or the
	// broker's horizons are unbounded and retention.maxReplayAge decides).
	SourceDeclared SourceKind = "Declared"
)

// Spec is the declared part of the inputs (config.Retention).
type Spec struct {
	// Mode is ModeDerived (also when empty) or ModeExplicit.
	Mode string
	// Window is the whole window in Explicit mode.
	Window time.Duration
	// MaxConsumerOutage is O.
	MaxConsumerOutage time.Duration
	// SafetyMargin is added to the derived window.
	SafetyMargin time.Duration
	// MaxReplayAge bounds a horizon the broker leaves unbounded; zero means
	// not declared.
	MaxReplayAge time.Duration
}

// SpecFrom reads the declared inputs from the runtime config.
func SpecFrom(r config.Retention) Spec {
	return Spec{
		Mode:              r.Mode,
		Window:            r.Window.Duration,
		MaxConsumerOutage: r.MaxConsumerOutage.Duration,
		SafetyMargin:      r.SafetyMargin.Duration,
		MaxReplayAge:      r.MaxReplayAge.Duration,
	}
}

func (s Spec) validate() error {
	switch s.Mode {
	case "", ModeDerived, ModeExplicit:
	default:
		return fmt.Errorf("%w: retention.mode must be Derived or Explicit, got %q", ErrInvalidSpec, s.Mode)
	}
	if s.Mode == ModeExplicit && s.Window <= 0 {
		return fmt.Errorf("%w: retention.window must be positive in Explicit mode", ErrInvalidSpec)
	}
	if s.MaxConsumerOutage < 0 || s.SafetyMargin < 0 || s.MaxReplayAge < 0 {
		return fmt.Errorf("%w: retention.maxConsumerOutage, safetyMargin and maxReplayAge must not be negative", ErrInvalidSpec)
	}
	return nil
}

// Attempts describes how long the broker keeps redelivering one message.
type Attempts struct {
	// Max is the number of deliveries; zero or less means unbounded.
	Max int
	// Leases is the time each delivery may stay unacknowledged before it is
	// redelivered (ack wait, visibility timeout, JetStream BackOff[i]). The
	// last value repeats for the remaining attempts.
	Leases []time.Duration
	// Backoffs is the pause after each failed delivery; the last value
	// repeats. Empty when the broker redelivers at once.
	Backoffs []time.Duration
}

// Bound is A: the sum over the attempts of lease + backoff, ∞ when the
// attempts are unbounded. It overcounts by the backoff after the last
// attempt, which only makes the window larger.
func (a Attempts) Bound() Horizon {
	if a.Max <= 0 {
		return Infinite()
	}
	n := min(a.Max, max(len(a.Leases), len(a.Backoffs)))
	sum := Finite(0)
	for i := range n {
		sum = sum.Add(nth(a.Leases, i)).Add(nth(a.Backoffs, i))
	}
	per := nth(a.Leases, a.Max) + nth(a.Backoffs, a.Max)
	return sum.Plus(times(per, a.Max-n))
}

// nth returns xs[i], the last element when i is past the end, 0 when empty.
func nth(xs []time.Duration, i int) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	return xs[min(i, len(xs)-1)]
}

// Observation is what an Inspector read from the broker.
type Observation struct {
	// Life is L: the longest an undelivered message stays on the broker.
	Life Horizon
	// Attempts bounds redelivery (A).
	Attempts Attempts
	// Replay is how far back a reset, seek or redrive can reach, as the
	// broker allows it (before retention.maxReplayAge is applied).
	Replay Horizon
	// Facts lists every broker input with where it came from, e.g.
	// "stream ORDERS max_age=48h retention=limits (broker)". They go into
	// DerivedFrom and into the inputs hash, so they must be stable.
	Facts []string
	// Info lists observations that do not enter the formula (the age of the
	// oldest Redis entry, Kafka's offsets.retention.minutes): DerivedFrom
	// only, never the hash.
	Info []string
	// Limits are the broker-side consumer limits read on the way (they do
	// not enter the formula or the hash).
	Limits ConsumerLimits
}

// ConsumerLimits are broker-side limits of an existing consumer that cap how
// many messages all replicas together hold unacknowledged. Zero: no limit,
// or nothing to read (the consumer does not exist yet, or the broker has no
// such limit).
type ConsumerLimits struct {
	// MaxAckPending of the JetStream durable consumer (-1: unlimited).
	MaxAckPending int
}

// Result is a derived (or declared) window and how it came about.
type Result struct {
	// Window is how long processed ids are kept; zero when the error
	// returned with the Result says the window is unknown.
	Window time.Duration
	// RedeliveryHorizon is min(L, A + O), or maxReplayAge when that is ∞.
	// Zero in Explicit mode (the broker is not read).
	RedeliveryHorizon Horizon
	// ReplayHorizon is the broker's replay reach, or maxReplayAge when that
	// is ∞. Zero in Explicit mode.
	ReplayHorizon Horizon
	// Source says whether the deciding horizon came from the broker or from
	// the spec.
	Source SourceKind
	// DerivedFrom lists every input and where it came from. It never holds
	// credentials.
	DerivedFrom string
	// InputsHash identifies the inputs (16 hex digits of a SHA-256).
	InputsHash string
	// ObservedAt is when the inputs were read.
	ObservedAt time.Time
	// Limits are the consumer's broker-side limits (Derived mode only).
	Limits ConsumerLimits
}

// Compute applies the formula to the declared spec and the broker's
// observation. It is pure. In Explicit mode the observation is ignored.
//
// When a horizon is unbounded and retention.maxReplayAge is not declared it
// returns an error wrapping ErrUnboundedReplay together with a Result whose
// horizons and DerivedFrom are filled in and whose Window is zero.
func Compute(spec Spec, obs Observation, now time.Time) (Result, error) {
	if err := spec.validate(); err != nil {
		return Result{}, err
	}
	if spec.Mode == ModeExplicit {
		return explicit(spec, now), nil
	}
	return derived(spec, obs, now)
}

func explicit(spec Spec, now time.Time) Result {
	facts := []string{"mode=Explicit (spec)", "window=" + FormatDuration(spec.Window) + " (spec)"}
	return Result{
		Window:      spec.Window,
		Source:      SourceDeclared,
		DerivedFrom: strings.Join(append(facts, "broker not read"), "; "),
		InputsHash:  hashOf(fmt.Sprintf("mode=Explicit window=%d", int64(spec.Window))),
		ObservedAt:  now,
	}
}

// bounded is a horizon after maxReplayAge was applied to it.
type bounded struct {
	h        Horizon
	declared bool // h is maxReplayAge standing in for an unbounded horizon
}

func derived(spec Spec, obs Observation, now time.Time) (Result, error) {
	a := obs.Attempts.Bound()
	aPlusO := a.Add(spec.MaxConsumerOutage)
	redeliver := MinHorizon(obs.Life, aPlusO)
	rd := applyMaxReplayAge(redeliver, spec)
	rp := applyMaxReplayAge(obs.Replay, spec)

	facts := append(append([]string{}, obs.Facts...), specFacts(spec)...)
	res := Result{
		RedeliveryHorizon: rd.h,
		ReplayHorizon:     rp.h,
		Source:            decidingSource(rd, rp),
		InputsHash:        hashOf(canonical(spec, obs)),
		ObservedAt:        now,
		Limits:            obs.Limits,
	}
	calc := fmt.Sprintf("L=%s A=%s R_redeliver=min(L,A+O)=%s R_replay=%s", obs.Life, a, redeliver, obs.Replay)
	res.DerivedFrom = strings.Join(append(append(facts, obs.Info...), calc+boundNote(rd, rp)), "; ")
	if err := unboundedError(redeliver, obs.Replay, rd, rp, obs.Facts); err != nil {
		return res, err
	}
	res.Window = MaxHorizon(rd.h, rp.h).Add(spec.SafetyMargin).D
	return res, nil
}

func applyMaxReplayAge(h Horizon, spec Spec) bounded {
	if h.Unbounded && spec.MaxReplayAge > 0 {
		return bounded{h: Finite(spec.MaxReplayAge), declared: true}
	}
	return bounded{h: h}
}

// decidingSource is Declared only when every horizon that decides the
// window (the larger one; both on a tie) is maxReplayAge standing in.
func decidingSource(rd, rp bounded) SourceKind {
	switch {
	case rp.h.Less(rd.h):
		return kindOf(rd.declared)
	case rd.h.Less(rp.h):
		return kindOf(rp.declared)
	}
	return kindOf(rd.declared && rp.declared)
}

func kindOf(declared bool) SourceKind {
	if declared {
		return SourceDeclared
	}
	return SourceBroker
}

func specFacts(spec Spec) []string {
	out := []string{
		"maxConsumerOutage=" + FormatDuration(spec.MaxConsumerOutage) + " (spec)",
		"safetyMargin=" + FormatDuration(spec.SafetyMargin) + " (spec)",
	}
	if spec.MaxReplayAge > 0 {
		return append(out, "maxReplayAge="+FormatDuration(spec.MaxReplayAge)+" (spec)")
	}
	return append(out, "maxReplayAge unset (spec)")
}

func boundNote(rd, rp bounded) string {
	var notes []string
	if rd.declared {
		notes = append(notes, "R_redeliver=∞ bounded by maxReplayAge")
	}
	if rp.declared {
		notes = append(notes, "R_replay=∞ bounded by maxReplayAge")
	}
	if len(notes) == 0 {
		return ""
	}
	return " (" + strings.Join(notes, ", ") + ")"
}

// unboundedError explains which horizon is unbounded when maxReplayAge did
// not bound it.
func unboundedError(redeliver, replay Horizon, rd, rp bounded, facts []string) error {
	var which []string
	if rd.h.Unbounded {
		which = append(which, fmt.Sprintf("redelivery is unbounded (L=∞ and A+O=∞: no message TTL and no bound on delivery attempts; R_redeliver=%s)", redeliver))
	}
	if rp.h.Unbounded {
		which = append(which, fmt.Sprintf("replay is unbounded (R_replay=%s)", replay))
	}
	if len(which) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s given %s; declare retention.maxReplayAge (how far back a replay may reach) or use mode Explicit; nothing is pruned until then",
		ErrUnboundedReplay, strings.Join(which, " and "), strings.Join(facts, "; "))
}

// canonical writes every input of the formula, typed values first, then the
// broker facts (which name the stream, topic or queue).
func canonical(spec Spec, obs Observation) string {
	return fmt.Sprintf("mode=Derived O=%d margin=%d maxReplayAge=%d L=%v attempts=%d leases=%v backoffs=%v replay=%v facts=%q",
		int64(spec.MaxConsumerOutage), int64(spec.SafetyMargin), int64(spec.MaxReplayAge),
		obs.Life, obs.Attempts.Max, obs.Attempts.Leases, obs.Attempts.Backoffs, obs.Replay, obs.Facts)
}

// hashOf is the short SHA-256 of the canonical inputs.
func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}
