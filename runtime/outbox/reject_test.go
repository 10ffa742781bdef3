package outbox

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
)

// An event larger than the server's max_payload can never be published: it
// goes to the dead letters with its reason (class outbox_rejected), and the
// events after it in its shard are published in order, not held behind it.
func TestRelayDeadLettersRejectedEvent(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	store, err := inbox.New(pool, config.Sink{Schema: "idc", InboxTable: "inbox_reject", Layout: config.LayoutTable}, inbox.WithOutbox(true))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatalf("NATS JetStream at %s is required (make nats; with IDC_TEST_NATS=system, make services): %v", natsURL, err)
	}
	defer nc.Close()
	huge := bytes.Repeat([]byte("x"), int(nc.MaxPayload())+1)
	rows := []inbox.OutboxRow{
		{EventID: "e1", SourceID: "m1", Shard: 5, Payload: []byte(`{"n":1}`), Headers: map[string]string{"Order-Version": "1"}},
		{EventID: "e2", SourceID: "m2", Shard: 5, Payload: huge},
		{EventID: "e3", SourceID: "m3", Shard: 5, Payload: []byte(`{"n":3}`)},
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return store.WriteOutbox(ctx, tx, rows) }); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	name := fmt.Sprintf("IDC_REJECT_%d", time.Now().UnixNano())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), name) }()
	pub, err := NewJetStreamPublisher(&config.EmitJetStream{URL: natsURL, Subject: name + ".out"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	metrics, _ := NewMetrics(prometheus.NewRegistry())
	r := &Relay{Store: postgres.Wrap(pool, store), DB: postgres.New(pool), Publisher: pub, Metrics: metrics, Log: logr.Discard(), BatchSize: 10, Workers: 1}
	for range 3 { // one pass per batch: e1 then the rejection, then e3
		if _, err := r.RelayShard(ctx, 5); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := store.OutboxStats(ctx); err != nil || st.Pending != 0 {
		t.Fatalf("outbox %+v (%v), want drained", st, err)
	}
	var dlID, reason, class string
	err = pool.QueryRow(ctx, `SELECT message_id, reason, reason_class FROM idc.inbox_reject_dead_letters`).Scan(&dlID, &reason, &class)
	if err != nil || dlID != "m2" || class != inbox.OutboxRejectedClass {
		t.Fatalf("dead letter %q %q %q (%v), want m2 with class %s", dlID, reason, class, err, inbox.OutboxRejectedClass)
	}
	s, _ := js.Stream(ctx, name)
	var got []string
	for seq := uint64(1); seq <= 2; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		got = append(got, m.Header.Get(jetstream.MsgIDHeader))
		if want := map[uint64]string{1: "1", 2: ""}[seq]; m.Header.Get("Order-Version") != want {
			t.Errorf("message %d: Order-Version header %q, want %q (emit.headers, stored with the row)", seq, m.Header.Get("Order-Version"), want)
		}
	}
	if info, _ := s.Info(ctx); info.State.Msgs != 2 || got[0] != "e1" || got[1] != "e3" {
		t.Errorf("stream holds %v (%d), want e1 then e3", got, info.State.Msgs)
	}
	if n := testutil.ToFloat64(metrics.Rejected); n != 1 {
		t.Errorf("idc_outbox_rejected_total = %v, want 1", n)
	}
}
