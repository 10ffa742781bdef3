package inbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

func TestWindowBeforeMigrate(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	s := newStore(t, pool, config.LayoutTable)
	st, err := s.ReadWindow(context.Background())
	if err != nil || st != nil {
		t.Fatalf("ReadWindow on an inbox without the table: %+v, %v; want nil, nil", st, err)
	}
	_, err = s.UpdateWindow(context.Background(), func(*WindowState) (*WindowState, error) {
		return &WindowState{Window: time.Hour}, nil
	})
	if !errors.Is(err, ErrNoWindowTable) {
		t.Fatalf("UpdateWindow without the table: %v, want ErrNoWindowTable", err)
	}
}

func TestUpdateWindowStoresAndLeavesUnchanged(t *testing.T) {
	ctx := context.Background()
	s, _ := migrated(t, config.LayoutTable)
	since := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
	want := WindowState{Window: 24 * time.Hour, InputsHash: "h", Source: "Declared", DerivedFrom: "spec.retention.window",
		AdoptedAt: since.Add(-time.Hour), PendingWindow: time.Hour, PendingSince: &since}
	got, err := s.UpdateWindow(ctx, func(cur *WindowState) (*WindowState, error) {
		if cur != nil {
			t.Errorf("first call sees %+v, want nil", cur)
		}
		return &want, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	read, err := s.ReadWindow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []*WindowState{got, read} {
		if st == nil || st.Window != want.Window || st.InputsHash != "h" || st.Source != "Declared" || st.DerivedFrom != want.DerivedFrom ||
			!st.AdoptedAt.Equal(want.AdoptedAt) || st.PendingWindow != time.Hour || st.PendingSince == nil || !st.PendingSince.Equal(since) ||
			st.UpdatedAt.IsZero() {
			t.Fatalf("stored %+v, want %+v", st, want)
		}
	}

	// nil next leaves the row as it is; an error from fn rolls back.
	same, err := s.UpdateWindow(ctx, func(*WindowState) (*WindowState, error) { return nil, nil })
	if err != nil || !same.UpdatedAt.Equal(read.UpdatedAt) || same.Window != want.Window {
		t.Fatalf("nil next: %+v, %v", same, err)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateWindow(ctx, func(*WindowState) (*WindowState, error) { return &WindowState{Window: time.Minute}, boom }); !errors.Is(err, boom) {
		t.Fatalf("fn error: %v, want boom", err)
	}
	// Clearing the shrink stores NULLs, read back as none pending.
	cleared, err := s.UpdateWindow(ctx, func(cur *WindowState) (*WindowState, error) {
		next := *cur
		next.PendingWindow, next.PendingSince = 0, nil
		return &next, nil
	})
	if err != nil || cleared.PendingWindow != 0 || cleared.PendingSince != nil || cleared.Window != want.Window {
		t.Fatalf("cleared: %+v, %v", cleared, err)
	}
}

// Two first writers both find no row, which FOR UPDATE cannot lock: the
// advisory lock must make them take turns, or one increment is lost.
func TestUpdateWindowSerializesFirstWriters(t *testing.T) {
	ctx := context.Background()
	s, pool := migrated(t, config.LayoutTable)
	const writers = 8
	var start, wg sync.WaitGroup
	start.Add(1)
	errs := make(chan error, writers)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start.Wait()
			_, err := s.UpdateWindow(ctx, func(cur *WindowState) (*WindowState, error) {
				next := &WindowState{Window: time.Millisecond, InputsHash: "n", Source: "Declared", DerivedFrom: "test", AdoptedAt: time.Now()}
				if cur != nil {
					next.Window = cur.Window + time.Millisecond
				}
				// Widen the race between reading and writing.
				time.Sleep(20 * time.Millisecond)
				return next, nil
			})
			errs <- err
		}()
	}
	start.Done()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.ReadWindow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Window != writers*time.Millisecond {
		t.Fatalf("window %s after %d serialized increments, want %s", st.Window, writers, writers*time.Millisecond)
	}
	_ = pool
}
