package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/internal/pgtest"
)

var natsURL string

func TestMain(m *testing.M) { os.Exit(natstest.MainOne(m, "floorconsumer", &natsURL)) }

// The floor inserts every delivery, duplicates included (it is no
// exactly-once consumer); with --inbox it inserts each id once. Both
// acknowledge everything.
func TestFloorConsumer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		inbox     bool
		wantRows  int
		wantInbox int
	}{
		{"plain floor inserts duplicates too", false, 10, 0},
		{"floor with inbox inserts each id once", true, 8, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pool, dsn := pgtest.NewPool(t)
			pgtest.Exec(t, pool, `CREATE TABLE floor_sink (body text NOT NULL)`, `CREATE TABLE floor_inbox (message_id text PRIMARY KEY)`)
			nc, err := nats.Connect(natsURL)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			stream := "FLOOR" + strings.ToUpper(fmt.Sprint(tc.inbox))
			_ = js.DeleteStream(ctx, stream)
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}}); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = js.DeleteStream(context.Background(), stream) }()
			cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "floor", AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				t.Fatal(err)
			}
			// Eight ids, two of them re-sent.
			for _, n := range []int{0, 1, 2, 3, 1, 4, 5, 3, 6, 7} {
				if _, err := js.Publish(ctx, stream+".o", fmt.Appendf(nil, `{"id":"o%d","n":%d}`, n, n)); err != nil {
					t.Fatal(err)
				}
			}
			inbox := ""
			if tc.inbox {
				inbox = "public.floor_inbox"
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- run(runCtx, natsURL, stream, "floor", dsn, "public.floor_sink", inbox, 4, 50*time.Millisecond, "127.0.0.1:0")
			}()
			deadline := time.Now().Add(30 * time.Second)
			for {
				info, err := cons.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream == 10 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not all acknowledged: pending %d, ack pending %d, ack floor %d", info.NumPending, info.NumAckPending, info.AckFloor.Stream)
				}
				time.Sleep(20 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil && runCtx.Err() == nil {
				t.Fatal(err)
			}
			var rows, ids, distinct int
			if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM floor_sink), (SELECT count(DISTINCT body::jsonb->>'id') FROM floor_sink), (SELECT count(*) FROM floor_inbox)`).Scan(&rows, &distinct, &ids); err != nil {
				t.Fatal(err)
			}
			if rows != tc.wantRows || distinct != 8 || ids != tc.wantInbox {
				t.Fatalf("floor_sink %d rows (%d ids), floor_inbox %d; want %d rows (8 ids), inbox %d", rows, distinct, ids, tc.wantRows, tc.wantInbox)
			}
		})
	}
}
