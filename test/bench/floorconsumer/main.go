// Command floorconsumer is the data-plane benchmark's floor consumer: the
// least a consumer of a JetStream stream into PostgreSQL can do per batch,
// so that the runtime's latency and CPU are measured against what this
// machine allows. It fetches, inserts the batch's bodies with one
// multi-row INSERT, commits and acknowledges. It has no inbox, no
// deduplication, no gate and no extraction: it gives no exactly-once
// guarantee (a redelivered message is inserted again), and what it
// measures is never a product figure.
//
// With --inbox it is the floor of an exactly-once consumer instead: the
// same transaction also claims each message's id (its "id" member) in a
// table whose primary key is the id, and inserts only the bodies whose
// claim was new, in one statement. That is the least any inbox can add to
// the floor: no extraction but the id, no fingerprint, no gate, no effect
// but the INSERT. It too is a floor, never a product figure.
//
// Only test/bench runs it (the "floor" rows of make bench). It serves
// /readyz (after its first fetch) and, on /metrics, the two
// idc_commit_duration_seconds series the benchmark reads from the runtime
// (count, sum and the 256 ms bucket), so the benchmark reads both the same
// way.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/tidwall/gjson"
)

func main() {
	natsURL := flag.String("nats", nats.DefaultURL, "NATS URL")
	stream := flag.String("stream", "", "stream")
	durable := flag.String("consumer", "", "durable pull consumer (created by the benchmark)")
	dsn := flag.String("dsn", "", "PostgreSQL DSN")
	table := flag.String("table", "", "schema-qualified table with one text column, body")
	batch := flag.Int("batch", 500, "most messages per fetch and per transaction")
	maxWait := flag.Duration("max-wait", 100*time.Millisecond, "how long one pull request waits on the server")
	addr := flag.String("addr", "127.0.0.1:0", "address of /readyz and /metrics")
	inbox := flag.String("inbox", "", "schema-qualified table with one text column, message_id, its primary key: claim each id there and insert only the new ones")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, *natsURL, *stream, *durable, *dsn, *table, *inbox, *batch, *maxWait, *addr); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

// commitStats is what /metrics serves.
type commitStats struct {
	count, over256ms atomic.Int64
	nanos            atomic.Int64
	ready            atomic.Bool
}

func (s *commitStats) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/readyz" {
		if !s.ready.Load() {
			http.Error(w, "not fetched yet", http.StatusServiceUnavailable)
		}
		return
	}
	n := s.count.Load()
	_, _ = fmt.Fprintf(w, "idc_commit_duration_seconds_bucket{le=\"0.256\"} %d\nidc_commit_duration_seconds_sum %g\nidc_commit_duration_seconds_count %d\n",
		n-s.over256ms.Load(), time.Duration(s.nanos.Load()).Seconds(), n)
}

// floor is one replica: its pull consumer, its connection and its INSERT.
type floor struct {
	cons   jetstream.Consumer
	db     *pgx.Conn
	insert string
	batch  int
	stats  *commitStats
	msgs   []jetstream.Msg
	bodies []string
	// ids is set with --inbox: the insert is then claim-gated.
	ids   []string
	dedup bool
}

func run(ctx context.Context, natsURL, stream, durable, dsn, table, inbox string, batch int, maxWait time.Duration, addr string) error {
	stats := &commitStats{}
	go func() { log.Print(http.ListenAndServe(addr, stats)) }() //nolint:gosec // loopback, benchmark only

	nc, err := nats.Connect(natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, stream, durable)
	if err != nil {
		return err
	}
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = db.Close(context.Background()) }()
	f := &floor{cons: cons, db: db, insert: "INSERT INTO " + table + " (body) SELECT unnest($1::text[])", batch: batch, stats: stats,
		msgs: make([]jetstream.Msg, 0, batch), bodies: make([]string, 0, batch)}
	if inbox != "" {
		f.dedup, f.ids = true, make([]string, 0, batch)
		f.insert = "WITH u AS (SELECT * FROM unnest($1::text[], $2::text[]) AS u(id, body)), " +
			"c AS (INSERT INTO " + inbox + " (message_id) SELECT DISTINCT id FROM u ON CONFLICT DO NOTHING RETURNING message_id) " +
			"INSERT INTO " + table + " (body) SELECT DISTINCT ON (u.id) u.body FROM u JOIN c ON c.message_id = u.id"
	}
	for ctx.Err() == nil {
		// One pull request for up to a batch; what it has delivered when
		// its first message arrived is committed at once, the rest in
		// the next rounds, and a new request goes out when it ended.
		req, err := cons.Fetch(batch, jetstream.FetchMaxWait(maxWait))
		if err != nil {
			return err
		}
		stats.ready.Store(true)
		if err := f.drain(ctx, req.Messages()); err != nil {
			return err
		}
		if err := req.Error(); err != nil && ctx.Err() == nil {
			log.Printf("fetch: %v", err)
		}
	}
	return nil
}

// drain commits and acknowledges what one pull request delivers, in
// rounds: each round takes what has arrived by the time it starts.
func (f *floor) drain(ctx context.Context, ch <-chan jetstream.Msg) error {
	for open := true; open; {
		m, ok := <-ch
		if !ok {
			return nil
		}
		f.msgs = append(f.msgs[:0], m)
		f.msgs, open = take(ch, f.msgs, f.batch)
		f.bodies, f.ids = f.bodies[:0], f.ids[:0]
		for _, m := range f.msgs {
			f.bodies = append(f.bodies, string(m.Data()))
			if f.dedup {
				f.ids = append(f.ids, gjson.GetBytes(m.Data(), "id").String())
			}
		}
		args := []any{f.bodies}
		if f.dedup {
			args = []any{f.ids, f.bodies}
		}
		if err := commit(ctx, f.db, f.insert, args, f.stats); err != nil {
			return err
		}
		for _, m := range f.msgs {
			if err := m.Ack(); err != nil {
				return err
			}
		}
	}
	return nil
}

// take appends what ch holds now, up to batch; open is false once ch closed.
func take(ch <-chan jetstream.Msg, msgs []jetstream.Msg, batch int) (_ []jetstream.Msg, open bool) {
	for len(msgs) < batch {
		select {
		case m, ok := <-ch:
			if !ok {
				return msgs, false
			}
			msgs = append(msgs, m)
		default:
			return msgs, true
		}
	}
	return msgs, true
}

func commit(ctx context.Context, db *pgx.Conn, insert string, args []any, stats *commitStats) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, insert, args...); err != nil {
		_ = tx.Rollback(context.Background())
		return err
	}
	start := time.Now()
	err = tx.Commit(ctx)
	took := time.Since(start)
	stats.count.Add(1)
	stats.nanos.Add(int64(took))
	if took > 256*time.Millisecond {
		stats.over256ms.Add(1)
	}
	return err
}
