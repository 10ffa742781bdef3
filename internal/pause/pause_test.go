package pause

import (
	"context"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	if !For(context.Background(), time.Millisecond) {
		t.Error("a wait that passed reports false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if For(ctx, time.Hour) {
		t.Error("a wait on an ended context reports true")
	}
}

func TestExponential(t *testing.T) {
	for _, tc := range []struct {
		n                      int
		initial, maxWait, want time.Duration
	}{
		{1, 100 * time.Millisecond, time.Second, 100 * time.Millisecond},
		{2, 100 * time.Millisecond, time.Second, 200 * time.Millisecond},
		{4, 100 * time.Millisecond, time.Second, 800 * time.Millisecond},
		{5, 100 * time.Millisecond, time.Second, time.Second},
		{60, 100 * time.Millisecond, time.Second, time.Second},
		{4, 100 * time.Millisecond, 0, 800 * time.Millisecond},
		{3, 2 * time.Second, time.Second, time.Second},
	} {
		if got := Exponential(tc.n, tc.initial, tc.maxWait); got != tc.want {
			t.Errorf("Exponential(%d, %s, %s) = %s, want %s", tc.n, tc.initial, tc.maxWait, got, tc.want)
		}
	}
}
