package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// --- the database ceiling ---

// dbCeiling runs the runtime's own claim + upsert (the sink's Inbox.Claim
// and Effect.Apply in one transaction, through runtime/sink as the loop
// runs them) over ceilingConns connections on pre-built batches of 500,
// with no broker: what the database alone sustains. On PostgreSQL that is
// the inbox Store and the effect on pgx; on MariaDB runtime/sink/mysql's
// claim and gated upsert.
func (t *throughputEnv) dbCeiling(b *testing.B) row {
	b.Helper()
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{}, batchSize)
	db := t.sink.open(b, ceilingConns)
	if _, pg := t.sink.(pgSink); !pg {
		defer db.Close() // PostgreSQL's is the environment's pool
	}
	store, err := db.Inbox(cfg.Sink)
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	eff, err := db.Effect(cfg.Sink.Effect, schema, cfg.Message.Entity)
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
	// retries counts the batches rolled back on a transient error and run
	// again, as the runtime's loop does (on MariaDB, InnoDB's deadlocks
	// between concurrent claims and upserts of the same ids and keys:
	// 1213, sink.ClassUnavailable).
	var retries atomic.Int64
	cpuStart := takeCPU(t.nats.pid)
	start := time.Now()
	for range ceilingConns {
		wg.Go(func() {
			for recs := range work {
				for {
					err := claimAndApply(ctx, db, store, eff, recs)
					if err == nil {
						break
					}
					if c, _ := db.Classify(err); c != sink.ClassUnavailable || retries.Add(1) > maxCeilingRetries {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuSince(cpuStart)
	cpu.sink = t.sink.kind()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	t.checkResult(b, schema)
	note := fmt.Sprintf("claim+upsert from Go, %d connections, no broker", ceilingConns)
	switch n := retries.Load(); {
	case n == 1:
		note += ", 1 batch retried after a deadlock"
	case n > 1:
		note += fmt.Sprintf(", %d batches retried after a deadlock", n)
	}
	return row{name: t.rowName("db_ceiling"), replicas: ceilingConns, batch: batchSize, msgs: len(t.w.bodies), elapsed: elapsed, cpu: cpu,
		note: note}
}

// maxCeilingRetries bounds the ceiling's retries of transient errors: a
// database that keeps failing fails the row.
const maxCeilingRetries = 1000

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

// claimAndApply is one batch's transaction: begin (READ COMMITTED),
// claim, apply the effect to the new ids, commit.
func claimAndApply(ctx context.Context, db sink.DB, store sink.Inbox, eff sink.Effect, recs []*extract.Message) (err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(ctx)
		}
	}()
	claims := make([]inbox.Claim, len(recs))
	for i, m := range recs {
		claims[i] = inbox.Claim{MessageID: m.ID, PublishedAt: m.PublishedAt, Fingerprint: inbox.Fingerprint(m.Body)}
	}
	fresh, err := store.Claim(ctx, tx, claims)
	if err != nil {
		return err
	}
	// The duplicates' fingerprints, read as the loop reads them (an id
	// reused for another payload); the workload has none.
	if len(fresh) < len(claims) {
		conflicts, err := store.Conflicts(ctx, tx, claims, fresh)
		if err != nil {
			return err
		}
		if len(conflicts) != 0 {
			return fmt.Errorf("%d id conflicts in a workload without any", len(conflicts))
		}
	}
	newRecs := make([]*extract.Message, 0, len(fresh))
	for _, m := range recs {
		if _, ok := fresh[m.ID]; ok {
			newRecs = append(newRecs, m)
		}
	}
	if _, err = eff.Apply(ctx, tx, newRecs); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
