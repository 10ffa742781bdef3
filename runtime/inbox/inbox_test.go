package inbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

var layouts = []config.Layout{config.LayoutTable, config.LayoutPartitioned}

func newStore(t *testing.T, pool *pgxpool.Pool, layout config.Layout, opts ...Option) *Store {
	t.Helper()
	s, err := New(pool, config.Sink{Schema: "idc", InboxTable: "inbox_orders", Layout: layout}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func migrated(t *testing.T, layout config.Layout) (*Store, *pgxpool.Pool) {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	s := newStore(t, pool, layout)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsurePartitions(context.Background(), time.Now().AddDate(0, 0, -3), 6); err != nil {
		t.Fatal(err)
	}
	return s, pool
}

func claim(t *testing.T, s *Store, pool *pgxpool.Pool, claims ...Claim) map[string]struct{} {
	t.Helper()
	got, err := claimTx(s, pool, claims)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func claimTx(s *Store, pool *pgxpool.Pool, claims []Claim) (got map[string]struct{}, err error) {
	ctx := context.Background()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		got, err = s.Claim(ctx, tx, claims)
		return err
	})
	return got, err
}

func ids(claims ...string) []Claim {
	out := make([]Claim, len(claims))
	for i, id := range claims {
		out[i] = Claim{MessageID: id, PublishedAt: time.Now()}
	}
	return out
}

func assertSet(t *testing.T, got map[string]struct{}, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, w := range want {
		if _, ok := got[w]; !ok {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestClaimInBatchAndCrossBatchDuplicates(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			s, pool := migrated(t, layout)
			assertSet(t, claim(t, s, pool, ids("a", "b", "a", "c", "b")...), "a", "b", "c")
			assertSet(t, claim(t, s, pool, ids("c", "d", "a", "e")...), "d", "e")
			assertSet(t, claim(t, s, pool, ids("a", "b", "c", "d", "e")...))
			var n int
			if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM idc.inbox_orders").Scan(&n); err != nil || n != 5 {
				t.Fatalf("inbox rows = %d, %v; want 5", n, err)
			}
		})
	}
}

func TestClaimRolledBackIsNotKept(t *testing.T) {
	s, pool := migrated(t, config.LayoutTable)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, tx, ids("x")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	assertSet(t, claim(t, s, pool, ids("x")...), "x")
}

func TestPartitionedRefusesIDFromAnotherPartition(t *testing.T) {
	s, pool := migrated(t, config.LayoutPartitioned)
	today := Day(time.Now())
	assertSet(t, claim(t, s, pool, Claim{MessageID: "m1", PublishedAt: today.Add(-30 * time.Hour)}), "m1")
	assertSet(t, claim(t, s, pool, Claim{MessageID: "m1", PublishedAt: today.Add(2 * time.Hour)}))
	assertSet(t, claim(t, s, pool, Claim{MessageID: "m1", PublishedAt: today.Add(-30 * time.Hour)}))
	assertSet(t, claim(t, s, pool, Claim{MessageID: "m2", PublishedAt: today.Add(2 * time.Hour)}), "m2")
}

// Three replicas claim overlapping ids at once (for the Partitioned layout
// each under a different publish day): every id must be claimed exactly once.
func TestConcurrentClaimsClaimEachIDOnce(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			s, pool := migrated(t, layout)
			const universe = 300
			var mu sync.Mutex
			claimedBy := map[string]int{}
			var wg sync.WaitGroup
			for w := range 3 {
				wg.Go(func() {
					order := rand.Perm(universe)
					for start := 0; start < universe; start += 25 {
						batch := make([]Claim, 0, 25)
						for _, n := range order[start : start+25] {
							batch = append(batch, Claim{
								MessageID:   fmt.Sprintf("id-%d", n),
								PublishedAt: time.Now().AddDate(0, 0, -w),
							})
						}
						got, err := claimTx(s, pool, batch)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						for id := range got {
							claimedBy[id]++
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(claimedBy) != universe {
				t.Fatalf("%d ids claimed, want %d", len(claimedBy), universe)
			}
			for id, n := range claimedBy {
				if n != 1 {
					t.Errorf("%s claimed %d times", id, n)
				}
			}
		})
	}
}

func TestExistingUnclaimAndDeadLetter(t *testing.T) {
	s, pool := migrated(t, config.LayoutTable)
	ctx := context.Background()
	claim(t, s, pool, ids("a", "b")...)
	got, err := s.Existing(ctx, pool, []string{"a", "z", "b"})
	if err != nil {
		t.Fatal(err)
	}
	assertSet(t, got, "a", "b")
	dl := DeadLetter{MessageID: "", NativeID: "S:1", Reason: "id: value missing\x00", Payload: []byte{0xff, 0},
		Headers: map[string]string{"k": "v\xff"}, Attempts: 1, PublishedAt: time.Now()}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := s.Unclaim(ctx, tx, []string{"a"}); err != nil {
			return err
		}
		inserted, err := s.DeadLetter(ctx, tx, []DeadLetter{dl, dl, {NativeID: "", Reason: "no native id"}})
		if err == nil && fmt.Sprint(inserted) != "[true false true]" {
			t.Errorf("inserted = %v, want [true false true]", inserted)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// A redelivery of the same poison message is not dead-lettered twice.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		inserted, err := s.DeadLetter(ctx, tx, []DeadLetter{dl})
		if err == nil && inserted[0] {
			t.Error("a redelivered dead letter was reported as new")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var n, nullIDs int
	if err := pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE message_id IS NULL) FROM idc.inbox_orders_dead_letters").Scan(&n, &nullIDs); err != nil {
		t.Fatal(err)
	}
	if n != 2 || nullIDs != 2 {
		t.Fatalf("dead letters = %d (null ids %d), want 2 (2)", n, nullIDs)
	}
	got, err = s.Existing(ctx, pool, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	assertSet(t, got, "b")
}

func TestStatsAndDrop(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			s, pool := migrated(t, layout)
			ctx := context.Background()
			claim(t, s, pool, ids("a", "b", "c")...)
			pgtest.Exec(t, pool, "UPDATE idc.inbox_orders SET processed_at = now() - interval '1 hour' WHERE message_id = 'a'", "ANALYZE idc.inbox_orders")
			st, err := s.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.OldestAge < 59*time.Minute || st.OldestAge > 61*time.Minute {
				t.Errorf("OldestAge = %s, want ~1h", st.OldestAge)
			}
			if st.Rows < 0 || st.Rows > 4 {
				t.Errorf("Rows = %d, want an estimate of 3", st.Rows)
			}
			for range 2 {
				if err := s.Drop(ctx); err != nil {
					t.Fatalf("Drop: %v", err)
				}
			}
			var left int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'idc'").Scan(&left); err != nil || left != 0 {
				t.Fatalf("%d tables left after Drop (%v)", left, err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("migrate after drop: %v", err)
			}
		})
	}
}

func TestDerivedNameStaysDistinct(t *testing.T) {
	long := "a234567890123456789012345678901234567890123456789012345678901"
	a, b := DerivedName(long, "_p20240101"), DerivedName(long, "_p20240102")
	if len(a) > 63 || a == b {
		t.Fatalf("derived names %q, %q must be distinct and at most 63 bytes", a, b)
	}
	if got := DerivedName("inbox", "_meta"); got != "inbox_meta" {
		t.Fatalf("DerivedName = %q", got)
	}
}
