package inbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
// advisory lock must make them take turns, or one increment is lost. The
// first writer holds its transaction open, having read no row, until the
// second is seen either waiting in PostgreSQL for the advisory lock (it
// serializes them) or reading the state itself (it does not): the two
// transactions overlap every time, not only when the scheduler lets them.
func TestUpdateWindowSerializesFirstWriters(t *testing.T) {
	ctx := context.Background()
	s, pool := migrated(t, config.LayoutTable)
	increment := func(cur *WindowState) *WindowState {
		next := &WindowState{Window: time.Millisecond, InputsHash: "n", Source: "Declared", DerivedFrom: "test", AdoptedAt: time.Now()}
		if cur != nil {
			next.Window = cur.Window + time.Millisecond
		}
		return next
	}
	firstRead := make(chan struct{})
	secondRead := make(chan *WindowState, 1)
	first := make(chan error, 1)
	go func() {
		_, err := s.UpdateWindow(ctx, func(cur *WindowState) (*WindowState, error) {
			if cur != nil {
				return nil, fmt.Errorf("the first writer found %+v, want no row", cur)
			}
			close(firstRead)
			return increment(cur), waitForSecondWriter(ctx, pool, secondRead)
		})
		first <- err
	}()
	<-firstRead
	_, err := s.UpdateWindow(ctx, func(cur *WindowState) (*WindowState, error) {
		secondRead <- cur
		return increment(cur), nil
	})
	if err != nil {
		t.Fatalf("second writer: %v", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first writer: %v", err)
	}
	st, err := s.ReadWindow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Window != 2*time.Millisecond {
		t.Fatalf("window %s after two overlapping first writers, want 2ms: the second read the state before the first stored it", st.Window)
	}
}

// waitForSecondWriter returns once the second writer waits for the window
// lock (pg_locks shows the advisory lock (lockKey, windowLockClass) not
// granted in this database) or has read the state (the lock did not hold
// it back; the caller's check then fails).
func waitForSecondWriter(ctx context.Context, pool *pgxpool.Pool, secondRead <-chan *WindowState) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	guard := time.NewTimer(time.Minute)
	defer guard.Stop()
	for {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_database d ON d.oid = l.database
			WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted
			AND l.objid = $1 AND l.objsubid = 2)`, windowLockClass).Scan(&waiting)
		if err != nil {
			return fmt.Errorf("while looking for the second writer in pg_locks: %w", err)
		}
		if waiting {
			return nil
		}
		select {
		case cur := <-secondRead:
			return fmt.Errorf("the second writer read %+v while the first had not committed: the window lock did not hold it back", cur)
		case <-guard.C:
			return errors.New("the second writer neither waited for the window lock nor read the state within a minute")
		case <-tick.C:
		}
	}
}
