package inbox

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// The relay's claim takes a shard's rows in id order and skips a shard
// another relay holds; marking sent, stats and the prune of sent rows past
// the window (never unsent ones) work on the real table.
func TestOutboxClaimMarkStatsPrune(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	s := newStore(t, pool, config.LayoutTable, WithOutbox(true))
	ctx := context.Background()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return s.WriteOutbox(ctx, tx, []OutboxRow{
			{EventID: "e1", SourceID: "m1", Shard: 3, Payload: []byte(`{}`)},
			{EventID: "e2", SourceID: "m2", Shard: 3, Payload: []byte(`{}`)},
			{EventID: "e3", SourceID: "m3", Shard: 4, Payload: []byte(`{}`)},
			{EventID: "e1", SourceID: "m1", Shard: 3, Payload: []byte(`{}`)}, // recorded before: kept once
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := s.OutboxStats(ctx); err != nil || st.Pending != 3 {
		t.Fatalf("stats %+v, %v; want 3 pending", st, err)
	}

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	events, ok, err := s.ClaimOutboxShard(ctx, holder, 3, 10)
	if err != nil || !ok || len(events) != 2 || events[0].EventID != "e1" || events[1].EventID != "e2" {
		t.Fatalf("claim of shard 3: %+v ok=%v err=%v; want e1, e2 in order", events, ok, err)
	}
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.ClaimOutboxShard(ctx, other, 3, 10); err != nil || ok {
		t.Fatalf("a second relay got shard 3 (ok=%v, %v) while the first holds it", ok, err)
	}
	if ev, ok, err := s.ClaimOutboxShard(ctx, other, 4, 10); err != nil || !ok || len(ev) != 1 {
		t.Fatalf("shard 4: %+v ok=%v err=%v", ev, ok, err)
	}
	_ = other.Rollback(ctx)
	if err := s.MarkOutboxSent(ctx, holder, []int64{events[0].ID}); err != nil {
		t.Fatal(err)
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := s.OutboxStats(ctx); err != nil || st.Pending != 2 {
		t.Fatalf("stats after marking one: %+v, %v; want 2 pending", st, err)
	}

	// e1 was sent two days ago, e2 is unsent and old: only e1 goes.
	pgtest.Exec(t, pool, `UPDATE idc.inbox_orders_outbox SET sent_at = now() - interval '2 days', created_at = now() - interval '3 days'`,
		`UPDATE idc.inbox_orders_outbox SET sent_at = NULL WHERE event_id <> 'e1'`)
	n, err := s.PruneOutbox(ctx, 24*time.Hour, 1, time.Minute)
	if err != nil || n != 1 {
		t.Fatalf("pruned %d (%v), want the one sent row past the window", n, err)
	}
	if st, err := s.OutboxStats(ctx); err != nil || st.Pending != 2 || st.OldestAge < 71*time.Hour {
		t.Fatalf("stats after prune: %+v, %v; want 2 pending, the oldest 3 days old", st, err)
	}
}
