package retention

import (
	"testing"
	"time"
)

func TestAdopt(t *testing.T) {
	win := func(d time.Duration, hash string) Result {
		return Result{Window: d, InputsHash: hash, Source: SourceBroker}
	}
	inForce := func(d time.Duration) *Applied { return &Applied{InForce: win(d, "old")} }
	pending := func(d, p time.Duration, since time.Time) *Applied {
		r := win(p, "pending")
		return &Applied{InForce: win(d, "old"), Pending: &r, ShrinkObservedAt: since}
	}
	cases := []struct {
		name        string
		current     *Applied
		derived     Result
		now         time.Time
		wantWindow  time.Duration
		wantPending bool
		wantSince   time.Time
	}{
		{name: "first window applies at once", current: nil, derived: win(49*h, "new"), now: t0, wantWindow: 49 * h},
		{name: "grow applies at once", current: inForce(25 * h), derived: win(49*h, "new"), now: t0, wantWindow: 49 * h},
		{name: "equal window applies at once (new inputs)", current: inForce(49 * h), derived: win(49*h, "new"), now: t0, wantWindow: 49 * h},
		{name: "shrink first observed waits", current: inForce(49 * h), derived: win(13*h, "new"), now: t0,
			wantWindow: 49 * h, wantPending: true, wantSince: t0},
		{name: "shrink still waiting before the old window elapsed", current: pending(49*h, 13*h, t0), derived: win(13*h, "new"),
			now: t0.Add(49*h - time.Second), wantWindow: 49 * h, wantPending: true, wantSince: t0},
		{name: "shrink adopted once the old window elapsed", current: pending(49*h, 13*h, t0), derived: win(13*h, "new"),
			now: t0.Add(49 * h), wantWindow: 13 * h},
		{name: "smaller still keeps the first observation", current: pending(49*h, 13*h, t0), derived: win(5*h, "new"),
			now: t0.Add(10 * h), wantWindow: 49 * h, wantPending: true, wantSince: t0},
		{name: "growth while a shrink waits cancels it", current: pending(49*h, 13*h, t0), derived: win(60*h, "new"),
			now: t0.Add(10 * h), wantWindow: 60 * h},
		{name: "back to the window in force cancels the shrink", current: pending(49*h, 13*h, t0), derived: win(49*h, "new"),
			now: t0.Add(10 * h), wantWindow: 49 * h},
		{name: "result without a window changes nothing", current: pending(49*h, 13*h, t0), derived: Result{},
			now: t0.Add(100 * h), wantWindow: 49 * h, wantPending: true, wantSince: t0},
		{name: "no window in force and none derived", current: nil, derived: Result{}, now: t0, wantWindow: 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			next, pend := Adopt(c.current, c.derived, c.now)
			if next.InForce.Window != c.wantWindow || pend != c.wantPending || (next.Pending != nil) != c.wantPending || !next.ShrinkObservedAt.Equal(c.wantSince) {
				t.Fatalf("got window=%s pending=%v (%v) since=%s; want window=%s pending=%v since=%s",
					next.InForce.Window, pend, next.Pending != nil, next.ShrinkObservedAt, c.wantWindow, c.wantPending, c.wantSince)
			}
			if c.wantPending && c.derived.Window > 0 && next.Pending.Window != c.derived.Window {
				t.Errorf("pending window %s, want the latest derivation %s", next.Pending.Window, c.derived.Window)
			}
			if !c.wantPending && c.derived.Window > 0 && next.InForce.InputsHash != "new" {
				t.Errorf("adopted result is not the derived one: %+v", next.InForce)
			}
		})
	}
}

func TestAdoptShrinkTimeline(t *testing.T) {
	applied, _ := Adopt(nil, Result{Window: 49 * h}, t0)
	applied, pend := Adopt(&applied, Result{Window: 13 * h}, t0.Add(time.Hour))
	if !pend || applied.ShrinkDueAt() != t0.Add(50*h) {
		t.Fatalf("pending=%v due=%s", pend, applied.ShrinkDueAt())
	}
	for _, at := range []time.Duration{2 * h, 30 * h, 50*h - time.Nanosecond} {
		if applied, pend = Adopt(&applied, Result{Window: 13 * h}, t0.Add(at)); !pend || applied.InForce.Window != 49*h {
			t.Fatalf("at +%s: shrink adopted early (window %s)", at, applied.InForce.Window)
		}
	}
	applied, pend = Adopt(&applied, Result{Window: 13 * h}, t0.Add(50*h))
	if pend || applied.InForce.Window != 13*h || !applied.ShrinkDueAt().IsZero() {
		t.Fatalf("not adopted at the due time: pending=%v window=%s", pend, applied.InForce.Window)
	}
}
