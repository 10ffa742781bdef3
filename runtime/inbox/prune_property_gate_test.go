package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// gateMessage is one version of one order, with a message id and a publish
// time that stay the same on every redelivery.
type gateMessage struct {
	id        string
	order     int
	version   int
	published time.Time
}

func (g gateMessage) record() *extract.Message {
	body, _ := json.Marshal(map[string]any{"orderId": fmt.Sprintf("o%d", g.order), "status": fmt.Sprintf("v%d", g.version), "version": g.version})
	m := extract.NewMessage(source.Message{NativeID: "n-" + g.id, Body: body, PublishedAt: g.published})
	m.ID = g.id
	return m
}

// deliver runs recs through the consumer's transaction shape: partitions
// ensured first, then one READ COMMITTED transaction that claims the ids and
// applies the effect to the new ones only.
func deliver(t *testing.T, s *inbox.Store, pool *pgxpool.Pool, eff effect.Effect, recs []*extract.Message) (fresh int, res effect.Result) {
	t.Helper()
	ctx := context.Background()
	times := make([]time.Time, len(recs))
	claims := make([]inbox.Claim, len(recs))
	for i, m := range recs {
		times[i] = m.PublishedAt
		claims[i] = inbox.Claim{MessageID: m.ID, PublishedAt: m.PublishedAt}
	}
	if err := s.EnsurePartitionsFor(ctx, times); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	got, err := s.Claim(ctx, tx, claims)
	if err != nil {
		t.Fatal(err)
	}
	var newRecs []*extract.Message
	for _, m := range recs {
		if _, ok := got[m.ID]; ok {
			newRecs = append(newRecs, m)
		}
	}
	res, err = eff.Apply(ctx, tx, newRecs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Failed) != 0 {
		t.Fatalf("effect failures: %+v", res.Failed)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return len(newRecs), res
}

func orderState(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT order_id, status || '/' || version FROM app.orders")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var k, v string
	if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = v; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPrunedIDsLateOlderSequenceDoesNotRegress: every version of every order
// is processed, the inbox rows age past the window and are pruned, then the
// broker redelivers old versions under their original ids and publish times
// (a replay, or a redelivery the window did not cover). The inbox no longer
// knows the ids, so they are claimed as new; the sequence gate refuses every
// one of them (counted stale) and the state does not move back. One genuinely
// newer version in the same redelivery still applies.
func TestPrunedIDsLateOlderSequenceDoesNotRegress(t *testing.T) {
	for _, layout := range []config.Layout{config.LayoutTable, config.LayoutPartitioned} {
		for _, seed := range propSeeds[:3] {
			t.Run(fmt.Sprintf("%s/seed=%d", layout, seed), func(t *testing.T) {
				ctx := context.Background()
				rng := propRNG(seed)
				s, pool := propStore(t, layout)
				pgtest.Exec(t, pool, "CREATE SCHEMA app",
					"CREATE TABLE app.orders (order_id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)")
				eff, err := effect.New(config.Effect{Upsert: &config.Upsert{
					Table: "orders", Key: []string{"order_id"}, SequenceColumn: "version",
					Columns: map[string]string{"order_id": "$.orderId", "status": "$.status", "version": "$.version"},
				}}, "app", nil)
				if err != nil {
					t.Fatal(err)
				}
				const window = 72 * time.Hour
				// Published ten days ago (older than the window on either clock).
				base := time.Now().Add(-10 * 24 * time.Hour)
				orders, versions := 6+rng.IntN(6), 3+rng.IntN(5)
				var msgs []gateMessage
				for o := range orders {
					for v := 1; v <= versions; v++ {
						msgs = append(msgs, gateMessage{
							id: fmt.Sprintf("m-o%d-v%d", o, v), order: o, version: v,
							published: base.Add(time.Duration(rng.IntN(3600)) * time.Second),
						})
					}
				}
				recsOf := func(ms []gateMessage) []*extract.Message {
					out := make([]*extract.Message, len(ms))
					for i, g := range ms {
						out[i] = g.record()
					}
					return out
				}
				// First delivery, shuffled, in random batches.
				rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
				for start := 0; start < len(msgs); {
					end := min(len(msgs), start+1+rng.IntN(7))
					deliver(t, s, pool, eff, recsOf(msgs[start:end]))
					start = end
				}
				settled := orderState(t, pool)
				for o := range orders {
					if want := fmt.Sprintf("v%d/%d", versions, versions); settled[fmt.Sprintf("o%d", o)] != want {
						t.Fatalf("o%d settled at %s, want %s", o, settled[fmt.Sprintf("o%d", o)], want)
					}
				}

				// Age the inbox rows (processed when published, ten days ago)
				// and prune them.
				pgtest.Exec(t, pool, "UPDATE idc.inbox_orders SET processed_at = now() - interval '10 days'")
				var res inbox.PruneResult
				if layout == config.LayoutTable {
					res, err = s.PruneTable(ctx, inbox.Bound{Window: window}, 1+rng.IntN(10), time.Minute)
				} else {
					if err = s.EnsurePartitions(ctx, time.Now(), 2); err != nil {
						t.Fatal(err)
					}
					res, err = s.PrunePartitions(ctx, inbox.Bound{Window: window})
				}
				if err != nil {
					t.Fatal(err)
				}
				allIDs := make([]string, len(msgs))
				for i, g := range msgs {
					allIDs[i] = g.id
				}
				known, err := s.Existing(ctx, pool, allIDs)
				if err != nil {
					t.Fatal(err)
				}
				if len(known) != 0 || (res.RowsDeleted == 0 && res.PartitionsDropped == 0) {
					t.Fatalf("after pruning %d ids are still in the inbox (result %+v); want none", len(known), res)
				}

				// Redelivery: every non-latest version, some latest ones again,
				// and one new version of order 0, shuffled, in random batches.
				var redo []gateMessage
				for _, g := range msgs {
					if g.version < versions || rng.IntN(2) == 0 {
						redo = append(redo, g)
					}
				}
				newer := gateMessage{id: "m-o0-new", order: 0, version: versions + 1, published: time.Now()}
				redo = append(redo, newer)
				rng.Shuffle(len(redo), func(i, j int) { redo[i], redo[j] = redo[j], redo[i] })
				var fresh, applied, stale int
				for start := 0; start < len(redo); {
					end := min(len(redo), start+1+rng.IntN(7))
					f, r := deliver(t, s, pool, eff, recsOf(redo[start:end]))
					fresh, applied, stale = fresh+f, applied+r.Applied, stale+r.Stale
					start = end
				}
				if fresh != len(redo) {
					t.Errorf("%d of %d redelivered ids claimed as new; pruned ids must be new to the inbox", fresh, len(redo))
				}
				if applied != 1 || stale != len(redo)-1 {
					t.Errorf("redelivery applied %d, stale %d; want 1 applied (the newer version), %d stale", applied, stale, len(redo)-1)
				}
				final := orderState(t, pool)
				for o := range orders {
					key, want := fmt.Sprintf("o%d", o), settled[fmt.Sprintf("o%d", o)]
					if o == 0 {
						want = fmt.Sprintf("v%d/%d", versions+1, versions+1)
					}
					if final[key] != want {
						t.Errorf("%s is at %s after the late redelivery, want %s", key, final[key], want)
					}
				}
				t.Logf("%d orders x %d versions; redelivered %d after pruning: %d applied, %d stale", orders, versions, len(redo), applied, stale)
			})
		}
	}
}
