package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkClaimCollation measures the inbox claim (BenchmarkClaimFingerprint's
// loop: batches of 500, 20% re-sends, fingerprints on) with the inbox's
// message_id compared byte by byte (COLLATE "C", what Migrate creates) and
// with the database's default collation (what it created before), in two
// databases: one with ICU's en-US (a typical production locale; glibc's
// en_US is not installed here) and one with this server's default
// (C.UTF-8). Runs alternate C, default, default, C per database; each
// reports its better run.
func BenchmarkClaimCollation(b *testing.B) {
	ctx := context.Background()
	batches := fingerprintBatches()
	for _, db := range []struct{ name, options string }{
		{"icu_en_us", "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"},
		{"server_default", ""},
	} {
		pool, err := pgxpool.New(ctx, newDatabaseWith(b, db.options))
		if err != nil {
			b.Fatal(err)
		}
		best := map[bool]time.Duration{}
		for run, byteOrder := range []bool{true, false, false, true} {
			store := fingerprintStore(b, pool, fmt.Sprintf("inbox_coll_%d", run))
			if !byteOrder {
				if _, err := pool.Exec(ctx, `ALTER TABLE `+store.QualifiedInbox()+` ALTER COLUMN message_id TYPE text COLLATE "default"`); err != nil {
					b.Fatal(err)
				}
			}
			took := claimAll(b, pool, store, batches, true)
			if d, ok := best[byteOrder]; !ok || took < d {
				best[byteOrder] = took
			}
		}
		pool.Close()
		for _, byteOrder := range []bool{true, false} {
			mode := map[bool]string{true: "C", false: "database_default"}[byteOrder]
			fmt.Printf("BENCH claim database=%s message_id_collation=%s claims=%d batch=%d seconds=%.3f ms_per_batch=%.2f\n",
				db.name, mode, fpBatches*fpBatchSize, fpBatchSize, best[byteOrder].Seconds(), float64(best[byteOrder].Microseconds())/1000/fpBatches)
		}
		fmt.Printf("RATIO claim_collation_c_vs_default_%s=%.2f (time per batch; below 1 is faster)\n", db.name, best[true].Seconds()/best[false].Seconds())
	}
}
