package retention

import (
	"math"
	"strings"
	"time"
)

// Horizon is a span of time that may be unbounded (∞). The zero value is a
// bounded horizon of length zero.
type Horizon struct {
	D         time.Duration
	Unbounded bool
}

// Finite returns a bounded horizon of length d (negative d counts as zero).
func Finite(d time.Duration) Horizon { return Horizon{D: max(d, 0)} }

// Infinite returns the unbounded horizon.
func Infinite() Horizon { return Horizon{Unbounded: true} }

// String renders the horizon as a compact Go duration ("24h30m") or "∞".
func (h Horizon) String() string {
	if h.Unbounded {
		return "∞"
	}
	return FormatDuration(h.D)
}

// Add returns h + d. A sum that does not fit in a time.Duration (about 292
// years) is unbounded: it is never a horizon anyone can wait out.
func (h Horizon) Add(d time.Duration) Horizon {
	if h.Unbounded {
		return h
	}
	if d > 0 && h.D > math.MaxInt64-d {
		return Infinite()
	}
	return Finite(h.D + d)
}

// Plus returns h + o.
func (h Horizon) Plus(o Horizon) Horizon {
	if o.Unbounded {
		return o
	}
	return h.Add(o.D)
}

// Less reports whether h is strictly shorter than o.
func (h Horizon) Less(o Horizon) bool {
	switch {
	case h.Unbounded:
		return false
	case o.Unbounded:
		return true
	}
	return h.D < o.D
}

// MinHorizon returns the shorter of a and b.
func MinHorizon(a, b Horizon) Horizon {
	if b.Less(a) {
		return b
	}
	return a
}

// MaxHorizon returns the longer of a and b.
func MaxHorizon(a, b Horizon) Horizon {
	if a.Less(b) {
		return b
	}
	return a
}

// times returns d*n, unbounded when it overflows.
func times(d time.Duration, n int) Horizon {
	if d <= 0 || n <= 0 {
		return Finite(0)
	}
	if int64(d) > math.MaxInt64/int64(n) {
		return Infinite()
	}
	return Finite(d * time.Duration(n))
}

// FormatDuration writes d like time.Duration.String but without the zero
// trailing units: 192h0m0s → "192h", 24h30m0s → "24h30m", 0 → "0s".
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
