package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
)

// BenchmarkRelayJetStream drains 20,000 outbox rows (1,000 entity keys)
// into a JetStream stream on loopback with 1 and 4 workers, batches of 500,
// and reports events/s. Not part of make bench; run it with
// go test -run '^$' -bench Relay -benchtime 1x ./runtime/outbox/.
func BenchmarkRelayJetStream(b *testing.B) {
	for _, workers := range []int{1, 4} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			for range b.N {
				benchDrain(b, workers, 20000)
			}
		})
	}
}

func benchDrain(b *testing.B, workers, rows int) {
	b.StopTimer()
	ctx := context.Background()
	pool, _ := pgtest.NewPool(b)
	store, err := inbox.New(pool, config.Sink{Schema: "idc", InboxTable: "inbox_bench", Layout: config.LayoutTable}, inbox.WithOutbox(true))
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	out := make([]inbox.OutboxRow, rows)
	for i := range out {
		out[i] = inbox.OutboxRow{EventID: fmt.Sprintf("e%07d", i), SourceID: fmt.Sprintf("m%07d", i),
			Shard: Shard(fmt.Sprintf("k%04d", i%1000)), Payload: []byte(`{"orderId":"o","status":"paid","version":1}`)}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return store.WriteOutbox(ctx, tx, out) }); err != nil {
		b.Fatal(err)
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		b.Fatalf("NATS JetStream at %s is required (make nats; with IDC_TEST_NATS=system, make services): %v", natsURL, err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	name := fmt.Sprintf("IDC_BENCH_%d", time.Now().UnixNano())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), name) }()
	pub, err := NewJetStreamPublisher(&config.EmitJetStream{URL: natsURL, Subject: name + ".out"})
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	metrics, _ := NewMetrics(prometheus.NewRegistry())
	r := &Relay{Store: postgres.Wrap(pool, store), DB: postgres.New(pool), Publisher: pub, Metrics: metrics, Log: logr.Discard(),
		BatchSize: 500, Workers: workers, Poll: 10 * time.Millisecond,
		BackoffInitial: 10 * time.Millisecond, BackoffMax: time.Second}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.StartTimer()
	start := time.Now()
	go func() { done <- r.Run(runCtx) }()
	for {
		st, err := store.OutboxStats(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if st.Pending == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	b.StopTimer()
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	s, _ := js.Stream(ctx, name)
	info, _ := s.Info(ctx)
	if info.State.Msgs != uint64(rows) {
		b.Fatalf("stream holds %d events, want %d", info.State.Msgs, rows)
	}
	b.ReportMetric(float64(rows)/took.Seconds(), "events/s")
}
