package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// With partitions, the prune job judges each silent replica by its own
// partition's durable (the one its progress row names), reading each
// distinct durable once: partition 0's, with nothing pending, retires its
// replica; partition 1's, holding an unacknowledged message, keeps both of
// its replicas holding pruning back.
func TestPruneSettlesEachPartitionsDurable(t *testing.T) {
	srv, err := natstest.StartCurrent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := fmt.Sprintf("IDC_PRUNE_PARTS_%d", time.Now().UnixNano())
	subject := strings.ToLower(stream)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject + ".*"},
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: subject + ".*", Destination: subject + ".{{partition(2,1)}}.{{wildcard(1)}}"}}); err != nil {
		t.Fatal(err)
	}
	durable := func(i int) (jetstream.Consumer, *time.Time) {
		c, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: config.PartitionConsumer("projector", i),
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour, FilterSubject: fmt.Sprintf("%s.%d.*", subject, i)})
		if err != nil {
			t.Fatal(err)
		}
		created := c.CachedInfo().Created
		return c, &created
	}
	_, created0 := durable(0)
	c1, created1 := durable(1)
	// A message of partition 1, delivered and never acknowledged.
	for k := 0; ; k++ {
		if _, err := js.Publish(ctx, fmt.Sprintf("%s.k%d", subject, k), nil); err != nil {
			t.Fatal(err)
		}
		if info, err := c1.Info(ctx); err != nil || info.NumPending > 0 {
			break
		}
	}
	batch, err := c1.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for range batch.Messages() {
	}

	f := newPruneFixture(t, config.LayoutTable, explicit(time.Hour), time.Hour)
	f.cfg.Source.NATSJetStream = &config.JetStream{URL: srv.URL, Stream: stream, Consumer: "projector", Partitions: 2}
	f.path = writeConfig(t, f.cfg)
	if code, lines := f.run(t, "migrate"); code != exitOK {
		t.Fatalf("migrate exit %d: %v", code, lines)
	}
	store, err := inbox.ForConfig(f.pool, f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, hb := range []struct {
		replica string
		i       int
		created *time.Time
	}{{"p0-a", 0, created0}, {"p1-b", 1, created1}, {"p1-c", 1, created1}} {
		age := 2 * time.Hour
		if err := store.WriteHeartbeat(ctx, inbox.Heartbeat{Replica: hb.replica, UnackedAge: &age,
			Consumer: &inbox.ConsumerIdentity{Kind: "NATSJetStream", Name: stream + "/" + config.PartitionConsumer("projector", hb.i), Created: hb.created}}); err != nil {
			t.Fatal(err)
		}
	}
	progress := pgx.Identifier{"app", inbox.NamesFor(f.cfg.Sink).Progress}.Sanitize()
	if _, err := f.pool.Exec(ctx, "UPDATE "+progress+" SET heartbeat_at = now() - interval '2 hours', started_at = now() - interval '3 hours'"); err != nil {
		t.Fatal(err)
	}

	code, lines := f.run(t, "prune")
	if code != exitOK {
		t.Fatalf("prune exit %d: %v", code, lines)
	}
	l := findLine(t, lines, "Prune finished")
	if l["brokerCalls"] != float64(2) || l["heldBack"] != true {
		t.Errorf("log line %v: want 2 broker calls (one per partition durable) and pruning held back", l)
	}
	if held := fmt.Sprint(l["heldBy"]); !strings.Contains(held, "p1-b") || !strings.Contains(held, "p1-c") || strings.Contains(held, "p0-a") {
		t.Errorf("held by %s, want partition 1's replicas only", held)
	}
	rows, err := f.pool.Query(ctx, "SELECT replica FROM "+progress)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(left)
	if strings.Join(left, ",") != "p1-b,p1-c" {
		t.Errorf("progress rows left %v: want partition 0's replica retired (its durable settled), partition 1's kept", left)
	}
}
