package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

const (
	fpBatches   = 200 // x 500 = 100k claims
	fpBatchSize = 500
	fpDupShare  = 5 // one claim in 5 re-sends an id of the previous batch
)

// BenchmarkClaimFingerprint measures the inbox claim as the loop runs it
// (one READ COMMITTED transaction per batch of 500, 20% duplicates of the
// previous batch), with payload fingerprints (SHA-256 of each payload, the
// column written, the duplicates' fingerprints read back and compared) and
// without (no fingerprint: what schema version 1 did). Runs alternate
// on, off, off, on in one process; each mode reports its better run.
func BenchmarkClaimFingerprint(b *testing.B) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, newDatabase(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	batches := fingerprintBatches()
	best := map[bool]time.Duration{}
	for run, on := range []bool{true, false, false, true} {
		store := fingerprintStore(b, pool, fmt.Sprintf("inbox_fp_%d", run))
		took := claimAll(b, pool, store, batches, on)
		if d, ok := best[on]; !ok || took < d {
			best[on] = took
		}
	}
	for _, on := range []bool{false, true} {
		mode := map[bool]string{false: "off", true: "on"}[on]
		fmt.Printf("BENCH claim fingerprint=%s claims=%d batch=%d seconds=%.3f ms_per_batch=%.2f\n",
			mode, fpBatches*fpBatchSize, fpBatchSize, best[on].Seconds(), float64(best[on].Microseconds())/1000/fpBatches)
	}
	fmt.Printf("RATIO claim_fingerprint_vs_none=%.2f\n", best[true].Seconds()/best[false].Seconds())
}

type fpClaim struct {
	id   string
	body []byte
}

// fingerprintBatches: each batch has 400 new ids and 100 re-sends (same
// payload) of ids of the batch before.
func fingerprintBatches() [][]fpClaim {
	out := make([][]fpClaim, fpBatches)
	n := 0
	for i := range out {
		for j := 0; j < fpBatchSize; j++ {
			if i > 0 && j%fpDupShare == 0 {
				out[i] = append(out[i], out[i-1][j+1])
				continue
			}
			out[i] = append(out[i], fpClaim{id: fmt.Sprintf("evt-%07d", n),
				body: []byte(fmt.Sprintf(`{"eventId":"evt-%07d","orderId":"o-%d","status":"shipped","version":%d,"amount":1234.5}`, n, n%5000, n))})
			n++
		}
	}
	return out
}

func fingerprintStore(b *testing.B, pool *pgxpool.Pool, table string) *inbox.Store {
	b.Helper()
	s, err := inbox.New(pool, config.Sink{Schema: "bench_fp", InboxTable: table, Layout: config.LayoutTable})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	return s
}

func claimAll(b *testing.B, pool *pgxpool.Pool, store *inbox.Store, batches [][]fpClaim, fingerprints bool) time.Duration {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	dups := 0
	for _, batch := range batches {
		err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			claims := make([]inbox.Claim, len(batch))
			for i, c := range batch {
				claims[i] = inbox.Claim{MessageID: c.id, PublishedAt: start}
				if fingerprints {
					claims[i].Fingerprint = inbox.Fingerprint(c.body)
				}
			}
			fresh, err := store.Claim(ctx, tx, claims)
			if err != nil {
				return err
			}
			dups += len(claims) - len(fresh)
			if fingerprints && len(fresh) < len(claims) {
				conflicts, err := store.Conflicts(ctx, tx, claims, fresh)
				if err != nil {
					return err
				}
				if len(conflicts) != 0 {
					return fmt.Errorf("%d conflicts for re-sends of the same payload", len(conflicts))
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	took := time.Since(start)
	if want := (fpBatches - 1) * fpBatchSize / fpDupShare; dups != want {
		b.Fatalf("%d duplicates skipped, want %d", dups, want)
	}
	return took
}
