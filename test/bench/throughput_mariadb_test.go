package bench

import (
	"fmt"
	"testing"
)

// perMessageRowLimit is how many messages the MariaDB per-message row
// (batch 1) is timed over: at one transaction per message the whole
// stream would take minutes, as perMessageLimit bounds
// BenchmarkInboxModes' per-message mode.
const perMessageRowLimit = perMessageLimit

// mariaDBRows are the MariaDB rows of the table, on the machine's MariaDB
// (internal/mysqltest's server), with the same code as the PostgreSQL
// rows (t.sink): the database ceiling and the headline JetStream → upsert
// row at 2 x 500, interleaved (RATIO mariadb_runtime_vs_db_ceiling, the
// median of the pairs), then the runtime at batch 1 (per message) over the
// first perMessageRowLimit messages, the better of two runs, against the
// headline (RATIO mariadb_batched_vs_per_message). It returns the ceiling
// ratio.
func (t *throughputEnv) mariaDBRows(b *testing.B) float64 {
	b.Helper()
	if t.mariadb == nil {
		t.mariadb = newMariaSink(b)
	}
	var ratio float64
	t.onSink(t.mariadb, func() {
		p := t.ceilingPairs(b)
		ceiling, headline := p.ceiling, p.headline
		ratio = p.ratio
		perMessage := t.runJetStreamUpTo(b, 2, 1, perMessageRowLimit)
		perMessage = fasterRow(perMessage, t.runJetStreamUpTo(b, 2, 1, perMessageRowLimit))
		perMessage.name = t.rowName("jetstream_upsert_per_message")
		printRow(ceiling)
		printRow(headline)
		printRow(perMessage)
		printCPU(ceiling)
		printCPU(headline)
		printCPU(perMessage)
		fmt.Printf("RATIO mariadb_batched_vs_per_message=%.2f (2 x 500 headline vs 2 x 1)\n", headline.rate()/perMessage.rate())
	})
	return ratio
}
