package sinktest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// concurrentRelays: relays claim every shard at once, in small batches,
// until the outbox is empty. Each event is sent exactly once, and each
// shard's events go in id order (the shard lock serializes its relays; a
// relay records what it sent before committing, while it still holds the
// shard). Failures must be transient.
func concurrentRelays(t *testing.T, h Harness) {
	e := setupWith(t, h, inbox.WithOutbox(true))
	const shards, perShard, relays, batch = 4, 30, 4, 7
	tx := e.begin(t)
	var rows []inbox.OutboxRow
	for i := range perShard {
		for s := range shards {
			rows = append(rows, inbox.OutboxRow{EventID: fmt.Sprintf("e-%d-%02d", s, i), SourceID: fmt.Sprintf("m-%d-%02d", s, i), Shard: s, Payload: []byte("p")})
		}
	}
	if err := e.in.WriteOutbox(ctx(t), tx, rows); err != nil {
		t.Fatalf("WriteOutbox: %v", err)
	}
	commit(t, tx)

	var mu sync.Mutex
	sent := map[int][]int64{} // shard → ids in the order relays sent them
	count := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, relays)
	for r := range relays {
		wg.Go(func() {
			for round := 0; ; round++ {
				empty := true
				for k := range shards {
					s := (r + k) % shards
					n, err := e.relayOnce(s, batch, func(events []inbox.PendingEvent) {
						mu.Lock()
						defer mu.Unlock()
						for _, ev := range events {
							sent[s] = append(sent[s], ev.ID)
							count[ev.EventID]++
						}
					})
					if err != nil {
						errs <- err
						return
					}
					if n != 0 {
						empty = false
					}
				}
				if empty {
					st, err := e.in.OutboxStats(context.Background())
					if err != nil {
						errs <- err
						return
					}
					if st.Pending == 0 {
						return
					}
				}
				if round > 10*perShard {
					errs <- fmt.Errorf("relay %d: the outbox is not empty after %d rounds", r, round)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, r := range rows {
		if count[r.EventID] != 1 {
			t.Errorf("event %s sent %d times, want once", r.EventID, count[r.EventID])
		}
	}
	for s, ids := range sent {
		for i := 1; i < len(ids); i++ {
			if ids[i] <= ids[i-1] {
				t.Fatalf("shard %d sent out of order: %v", s, ids)
			}
		}
	}
}

// relayOnce claims shard, hands its events to record and marks them sent,
// in one transaction; a shard another relay holds is 0 events. A
// transient failure is 0 events too (the next round retries).
func (e *env) relayOnce(shard, limit int, record func([]inbox.PendingEvent)) (int, error) {
	c := context.Background()
	tx, err := e.db.Begin(c)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(c) }()
	events, ok, err := e.in.ClaimOutboxShard(c, tx, shard, limit)
	if err == nil && ok && len(events) > 0 {
		ids := make([]int64, len(events))
		for i, ev := range events {
			ids[i] = ev.ID
		}
		if err = e.in.MarkOutboxSent(c, tx, ids); err == nil {
			// Recorded before the commit, while the shard is still held;
			// a commit that fails after this fails the test below.
			record(events)
			if err = tx.Commit(c); err != nil {
				return 0, fmt.Errorf("commit after recording events as sent: %w", err)
			}
		}
	}
	if err != nil {
		if class, _ := e.db.Classify(err); class == sink.ClassUnavailable {
			return 0, nil
		}
		return 0, fmt.Errorf("relay of shard %d: %w", shard, err)
	}
	return len(events), nil
}
