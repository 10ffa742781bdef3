package retention

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

func TestWindowStateRoundTrip(t *testing.T) {
	since := t0.Add(3 * h)
	in := Applied{
		InForce: Result{Window: 49 * h, InputsHash: "abc", Source: SourceBroker, DerivedFrom: "stream MaxAge=48h (broker)",
			RedeliveryHorizon: Infinite(), ReplayHorizon: Finite(48 * h)},
		Pending:          &Result{Window: 13 * h},
		ShrinkObservedAt: since,
	}
	st := stateFromApplied(in, nil, t0)
	if st.RedeliveryHorizon != "∞" || st.ReplayHorizon != "48h" || !st.AdoptedAt.Equal(t0) ||
		st.PendingWindow != 13*h || st.PendingSince == nil || !st.PendingSince.Equal(since) {
		t.Fatalf("row %+v does not carry the applied state", st)
	}
	back := appliedFromState(st)
	if back == nil || back.InForce != in.InForce || back.Pending == nil || back.Pending.Window != 13*h || !back.ShrinkObservedAt.Equal(since) {
		t.Fatalf("round trip gave %+v, want %+v", back, in)
	}

	// Explicit windows have no horizons: stored as "", read back as none.
	explicit := stateFromApplied(Applied{InForce: Result{Window: h, Source: SourceDeclared}}, nil, t0)
	if explicit.RedeliveryHorizon != "" || explicit.ReplayHorizon != "" || explicit.PendingSince != nil {
		t.Fatalf("explicit row %+v", explicit)
	}
	if got := appliedFromState(explicit); got.InForce.RedeliveryHorizon != (Horizon{}) || got.Pending != nil {
		t.Fatalf("explicit applied %+v", got)
	}

	// adopted_at keeps the first adoption of the same window and inputs.
	again := stateFromApplied(Applied{InForce: in.InForce}, st, t0.Add(5*h))
	if !again.AdoptedAt.Equal(t0) {
		t.Fatalf("adopted_at moved to %s for an unchanged window", again.AdoptedAt)
	}
	changed := stateFromApplied(Applied{InForce: Result{Window: 60 * h, InputsHash: "def"}}, st, t0.Add(5*h))
	if !changed.AdoptedAt.Equal(t0.Add(5 * h)) {
		t.Fatalf("adopted_at %s, want the time of the new window", changed.AdoptedAt)
	}
	if appliedFromState(nil) != nil || appliedFromState(&inbox.WindowState{}) != nil {
		t.Fatal("no stored window must read as nothing in force")
	}
}

func TestCeilMillisecond(t *testing.T) {
	for in, want := range map[time.Duration]time.Duration{
		0: 0, time.Millisecond: time.Millisecond, 49*h + 300*time.Microsecond: 49*h + time.Millisecond, 1: time.Millisecond,
	} {
		if got := ceilMillisecond(in); got != want {
			t.Errorf("ceilMillisecond(%s) = %s, want %s", in, got, want)
		}
	}
}

func storedWindowStore(t *testing.T) (*inbox.Store, string) {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	s, err := inbox.New(pool, windowSink)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s, dsn
}

var windowSink = config.Sink{Schema: "idc", InboxTable: "inbox_window_test", Layout: config.LayoutTable}

func TestAdoptStored(t *testing.T) {
	ctx := context.Background()
	store, dsn := storedWindowStore(t)
	broker := func(w time.Duration, hash string) Result {
		return Result{Window: w, InputsHash: hash, Source: SourceBroker, DerivedFrom: "from " + hash,
			RedeliveryHorizon: Finite(w - h), ReplayHorizon: Infinite()}
	}
	adopt := func(s *inbox.Store, d Result, now time.Time) (Applied, bool) {
		t.Helper()
		a, pending, err := AdoptStored(ctx, s, d, now)
		if err != nil {
			t.Fatal(err)
		}
		return a, pending
	}
	row := func(s *inbox.Store) *inbox.WindowState {
		t.Helper()
		st, err := s.ReadWindow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}

	if a, err := StoredApplied(ctx, store); err != nil || a != nil {
		t.Fatalf("before any adoption: %+v, %v; want nothing stored", a, err)
	}

	// First adoption applies at once and stores the derivation.
	a, pending := adopt(store, broker(24*h, "first"), t0)
	if pending || a.InForce.Window != 24*h {
		t.Fatalf("first adoption: window %s pending %v", a.InForce.Window, pending)
	}
	st := row(store)
	if st == nil || st.Window != 24*h || st.InputsHash != "first" || st.Source != "Broker" || st.DerivedFrom != "from first" ||
		st.RedeliveryHorizon != "23h" || st.ReplayHorizon != "∞" || !st.AdoptedAt.Equal(t0) || st.PendingSince != nil {
		t.Fatalf("stored after the first adoption: %+v", st)
	}

	// An unchanged derivation writes nothing.
	adopt(store, broker(24*h, "first"), t0.Add(time.Hour))
	if again := row(store); !again.UpdatedAt.Equal(st.UpdatedAt) || !again.AdoptedAt.Equal(t0) {
		t.Fatalf("an unchanged derivation rewrote the row: %+v", again)
	}

	// Growth applies at once.
	t1 := t0.Add(2 * h)
	if a, pending = adopt(store, broker(48*h, "grown"), t1); pending || a.InForce.Window != 48*h {
		t.Fatalf("grow: window %s pending %v", a.InForce.Window, pending)
	}

	// A shrink waits; later, smaller derivations keep its start.
	t2 := t1.Add(time.Hour)
	if a, pending = adopt(store, broker(time.Hour, "shrunk"), t2); !pending || a.InForce.Window != 48*h || !a.ShrinkObservedAt.Equal(t2) {
		t.Fatalf("shrink: %+v pending %v", a, pending)
	}
	if a, pending = adopt(store, broker(2*time.Hour, "shrunk2"), t2.Add(10*h)); !pending || a.InForce.Window != 48*h ||
		a.Pending.Window != 2*h || !a.ShrinkObservedAt.Equal(t2) {
		t.Fatalf("shrink observed again: %+v pending %v", a, pending)
	}
	st = row(store)
	if st.Window != 48*h || st.InputsHash != "grown" || st.PendingWindow != 2*h || st.PendingSince == nil || !st.PendingSince.Equal(t2) {
		t.Fatalf("stored while the shrink waits: %+v", st)
	}

	// A derivation without a window changes nothing.
	if a, pending = adopt(store, Result{}, t2.Add(100*h)); !pending || a.InForce.Window != 48*h {
		t.Fatalf("no window derived: %+v pending %v", a, pending)
	}
	if again := row(store); !again.UpdatedAt.Equal(st.UpdatedAt) || again.PendingWindow != 2*h {
		t.Fatalf("a derivation without a window rewrote the row: %+v", again)
	}

	// A re-created resource: a second Store over the same tables, with no
	// status to go by, sees the pending shrink and keeps waiting.
	other, err := inbox.New(newPool(t, dsn), windowSink)
	if err != nil {
		t.Fatal(err)
	}
	got, err := StoredApplied(ctx, other)
	if err != nil || got == nil || got.InForce.Window != 48*h || got.Pending == nil || !got.ShrinkObservedAt.Equal(t2) {
		t.Fatalf("second store reads %+v, %v; want 48h with the shrink pending since %s", got, err, t2)
	}
	if a, pending = adopt(other, broker(time.Hour, "shrunk"), t2.Add(48*h-time.Second)); !pending || a.InForce.Window != 48*h || !a.ShrinkObservedAt.Equal(t2) {
		t.Fatalf("second store before the old window elapsed: %+v pending %v", a, pending)
	}

	// Once the old window has elapsed since the shrink was first seen, the
	// smaller window is adopted and the pending shrink cleared.
	t3 := t2.Add(48 * h)
	if a, pending = adopt(other, broker(time.Hour, "shrunk"), t3); pending || a.InForce.Window != time.Hour {
		t.Fatalf("after the old window: %+v pending %v", a, pending)
	}
	st = row(store)
	if st.Window != time.Hour || st.InputsHash != "shrunk" || st.PendingWindow != 0 || st.PendingSince != nil || !st.AdoptedAt.Equal(t3) {
		t.Fatalf("stored after the shrink was adopted: %+v", st)
	}

	// Drop (deletionPolicy Delete) removes the state with the tables.
	if err := store.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	if a, err := StoredApplied(ctx, store); err != nil || a != nil {
		t.Fatalf("after Drop: %+v, %v; want nothing stored", a, err)
	}
}

// newPool opens a second pool on dsn, as another process would.
func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
