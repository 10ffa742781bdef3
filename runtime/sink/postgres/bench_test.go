package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// BenchmarkSeam measures one claim + upsert transaction of 100 messages on
// the real PostgreSQL, called directly on the pgx Store and effect (the
// consumer's path) and through the seam: the allocations per batch must be
// the same, and the round trips are (BEGIN, claim, upsert, COMMIT).
func BenchmarkSeam(b *testing.B) {
	p, _ := pgtest.NewPool(b)
	pgtest.Exec(b, p, "CREATE SCHEMA bench", "CREATE TABLE bench.orders (order_id text PRIMARY KEY, status text, version bigint)")
	cfgSink := config.Sink{Schema: "bench", InboxTable: "inbox_bench", Layout: config.LayoutTable}
	up := config.Effect{Upsert: &config.Upsert{Table: "orders", Key: []string{"order_id"}, SequenceColumn: "version",
		Columns: map[string]string{"order_id": "$.orderId", "status": "$.status", "version": "$.version"}}}
	store, err := inbox.New(p, cfgSink)
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	direct, err := effect.New(up, "bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	db := postgres.New(p)
	in, _ := db.Inbox(cfgSink)
	seamEff, err := db.Effect(up, "bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	// version grows across both runs, so every batch updates every order
	// (none is refused by the gate) and the two do the same work.
	version := 0
	batch := func(prefix string, n int) ([]inbox.Claim, []*effect.Record) {
		version++
		claims := make([]inbox.Claim, 100)
		recs := make([]*effect.Record, 100)
		for i := range claims {
			id := fmt.Sprintf("%s-%d-%d", prefix, n, i)
			claims[i] = inbox.Claim{MessageID: id}
			m := extract.NewMessage(source.Message{Body: fmt.Appendf(nil, `{"orderId":"o%d","status":"s","version":%d}`, i, version)})
			m.ID = id
			recs[i] = m
		}
		return claims, recs
	}
	ctx := context.Background()
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for n := 0; b.Loop(); n++ {
			b.StopTimer()
			claims, recs := batch("d", n)
			b.StartTimer()
			tx, err := p.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := store.Claim(ctx, tx, claims); err != nil {
				b.Fatal(err)
			}
			if _, err := direct.Apply(ctx, tx, recs); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("seam", func(b *testing.B) {
		b.ReportAllocs()
		for n := 0; b.Loop(); n++ {
			b.StopTimer()
			claims, recs := batch("s", n)
			b.StartTimer()
			var tx sink.Tx
			tx, err := db.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := in.Claim(ctx, tx, claims); err != nil {
				b.Fatal(err)
			}
			if _, err := seamEff.Apply(ctx, tx, recs); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
