package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// --- the database ceiling ---

// dbCeiling runs the runtime's own claim + upsert (inbox.Store.Claim and
// effect.Apply in one transaction) over ceilingConns connections on
// pre-built batches of 500, with no broker: what PostgreSQL alone sustains.
func (t *throughputEnv) dbCeiling(b *testing.B) row {
	b.Helper()
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{}, batchSize)
	store, err := inbox.New(t.pool, cfg.Sink)
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	eff, err := effect.New(cfg.Sink.Effect, schema, cfg.Message.Entity)
	if err != nil {
		b.Fatal(err)
	}
	batches := t.prebuiltBatches(b, batchSize)
	work := make(chan []*extract.Message, len(batches))
	for _, bt := range batches {
		work <- bt
	}
	close(work)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, ceilingConns)
	cpuStart := takeCPU()
	start := time.Now()
	for range ceilingConns {
		wg.Go(func() {
			for recs := range work {
				if err := claimAndApply(ctx, t.pool, store, eff, recs); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuSince(cpuStart)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	t.checkResult(b, schema)
	return row{name: "db_ceiling", replicas: ceilingConns, batch: batchSize, msgs: len(t.w.bodies), elapsed: elapsed, cpu: cpu,
		note: fmt.Sprintf("claim+upsert from Go, %d connections, no broker", ceilingConns)}
}

// prebuiltBatches extracts ids up front and de-duplicates within each
// batch, as the runtime's prepare step does.
func (t *throughputEnv) prebuiltBatches(b *testing.B, size int) [][]*extract.Message {
	b.Helper()
	id := extract.MustCompile("$.id")
	var out [][]*extract.Message
	for i := 0; i < len(t.w.bodies); i += size {
		seen := map[string]bool{}
		var recs []*extract.Message
		for _, body := range t.w.bodies[i:min(i+size, len(t.w.bodies))] {
			m := extract.NewMessage(source.Message{Body: body, PublishedAt: time.Now()})
			v, err := id.Text(m)
			if err != nil {
				b.Fatal(err)
			}
			if seen[v] {
				continue
			}
			seen[v] = true
			m.ID = v
			recs = append(recs, m)
		}
		out = append(out, recs)
	}
	return out
}

func claimAndApply(ctx context.Context, pool *pgxpool.Pool, store *inbox.Store, eff effect.Effect, recs []*extract.Message) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		claims := make([]inbox.Claim, len(recs))
		for i, m := range recs {
			claims[i] = inbox.Claim{MessageID: m.ID, PublishedAt: m.PublishedAt}
		}
		fresh, err := store.Claim(ctx, tx, claims)
		if err != nil {
			return err
		}
		newRecs := make([]*extract.Message, 0, len(fresh))
		for _, m := range recs {
			if _, ok := fresh[m.ID]; ok {
				newRecs = append(newRecs, m)
			}
		}
		_, err = eff.Apply(ctx, tx, newRecs)
		return err
	})
}
