package sinktest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

func record(id, body string) *effect.Record {
	m := extract.NewMessage(source.Message{NativeID: "n-" + id, Body: []byte(body)})
	m.ID = id
	return m
}

func orderRec(id, order, status string, version int) *effect.Record {
	return record(id, fmt.Sprintf(`{"orderId":%q,"status":%q,"version":%d}`, order, status, version))
}

func (e *env) apply(t *testing.T, eff sink.Effect, recs ...*effect.Record) effect.Result {
	t.Helper()
	tx := e.begin(t)
	res, err := eff.Apply(ctx(t), tx, recs)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	commit(t, tx)
	return res
}

func sequenceGate(t *testing.T, h Harness) {
	e := setup(t, h)
	h.CreateOrders(t, e.db, e.schema, "orders")
	eff := ordersEffect(t, e)
	want := func(what string, res effect.Result, applied, stale int, rows map[string]Order) {
		t.Helper()
		if res.Applied != applied || res.Stale != stale || len(res.Failed) != 0 {
			t.Errorf("%s: applied %d stale %d failed %v; want applied %d stale %d", what, res.Applied, res.Stale, res.Failed, applied, stale)
		}
		got := h.Orders(t, e.db, e.schema, "orders")
		for k, v := range rows {
			if got[k] != v {
				t.Errorf("%s: order %s = %+v, want %+v", what, k, got[k], v)
			}
		}
		if len(got) != len(rows) {
			t.Errorf("%s: %d orders, want %d", what, len(got), len(rows))
		}
	}
	// A stale version in the same batch, after the newer one: collapsed away.
	res := e.apply(t, eff, orderRec("m1", "o1", "shipped", 2), orderRec("m2", "o1", "created", 1), orderRec("m3", "o2", "created", 1))
	want("first batch", res, 2, 1, map[string]Order{"o1": {"shipped", 2}, "o2": {"created", 1}})
	// Older and equal versions of stored state: refused by the gate; a
	// newer one of o2 passes in the same batch.
	res = e.apply(t, eff, orderRec("m4", "o1", "created", 1), orderRec("m5", "o1", "paid", 2), orderRec("m6", "o2", "paid", 5))
	want("stale against the table", res, 1, 2, map[string]Order{"o1": {"shipped", 2}, "o2": {"paid", 5}})
	// A tie inside the batch keeps the earlier record; a new key is inserted.
	res = e.apply(t, eff, orderRec("m7", "o1", "delivered", 3), orderRec("m8", "o1", "lost", 3), orderRec("m9", "o3", "created", 7))
	want("tie in the batch", res, 2, 1, map[string]Order{"o1": {"delivered", 3}, "o2": {"paid", 5}, "o3": {"created", 7}})
	// A record whose key cannot be read fails alone.
	res = e.apply(t, eff, record("m10", `{"status":"x","version":9}`), orderRec("m11", "o3", "paid", 8))
	if len(res.Failed) != 1 || res.Failed[0].Index != 0 || res.Applied != 1 {
		t.Errorf("a record without its key: %+v; want it failed alone and the other applied", res)
	}
}

func ordersEffect(t *testing.T, e *env) sink.Effect {
	t.Helper()
	eff, err := e.db.Effect(config.Effect{Upsert: &config.Upsert{Table: "orders", Key: []string{"order_id"}, SequenceColumn: "version",
		Columns: map[string]string{"order_id": "$.orderId", "status": "$.status", "version": "$.version"}}}, e.schema, nil)
	if err != nil {
		t.Fatalf("Effect: %v", err)
	}
	return eff
}

// concurrentUpserts: workers upsert overlapping keys with versions in no
// particular order, each batch in its own transaction (retried when the
// dialect says transient). Whatever the interleaving, every key ends at
// its highest version, with that version's status.
func concurrentUpserts(t *testing.T, h Harness) {
	e := setup(t, h)
	h.CreateOrders(t, e.db, e.schema, "orders")
	eff := ordersEffect(t, e)
	const workers, batches, keys = 4, 20, 12
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for b := range batches {
				var recs []*effect.Record
				for i := range 8 {
					k := (w*5 + b*3 + i*7) % keys
					v := (w*31 + b*17 + i*13) % 97
					recs = append(recs, orderRec(fmt.Sprintf("m-%d-%d-%d", w, b, i), fmt.Sprintf("o%02d", k), fmt.Sprintf("s%d", v), v))
				}
				if err := e.applyRetrying(eff, recs); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := map[string]Order{}
	for w := range workers {
		for b := range batches {
			for i := range 8 {
				k, v := fmt.Sprintf("o%02d", (w*5+b*3+i*7)%keys), int64((w*31+b*17+i*13)%97)
				if cur, ok := want[k]; !ok || v > cur.Version {
					want[k] = Order{Status: fmt.Sprintf("s%d", v), Version: v}
				}
			}
		}
	}
	got := h.Orders(t, e.db, e.schema, "orders")
	for k, o := range want {
		if got[k] != o {
			t.Errorf("order %s = %+v, want %+v (the highest version)", k, got[k], o)
		}
	}
}

// applyRetrying applies recs in their own transaction, retrying transient
// failures.
func (e *env) applyRetrying(eff sink.Effect, recs []*effect.Record) error {
	c := context.Background()
	for {
		err := func() error {
			tx, err := e.db.Begin(c)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(c) }()
			if _, err := eff.Apply(c, tx, recs); err != nil {
				return err
			}
			return tx.Commit(c)
		}()
		if err == nil {
			return nil
		}
		if class, _ := e.db.Classify(err); class != sink.ClassUnavailable {
			return fmt.Errorf("upsert failed with a non-transient error (class %d): %w", class, err)
		}
	}
}

func appendRows(t *testing.T, h Harness) {
	e := setup(t, h)
	h.CreateOrders(t, e.db, e.schema, "orders")
	eff, err := e.db.Effect(config.Effect{Append: &config.Append{Table: "orders_events",
		Columns: map[string]string{"event_id": "@messageId", "order_id": "$.orderId"}}}, e.schema, nil)
	if err != nil {
		t.Fatalf("Effect: %v", err)
	}
	res := e.apply(t, eff, orderRec("e1", "o1", "a", 1), orderRec("e2", "o1", "b", 2), record("e3", `not json`))
	if res.Applied != 2 || len(res.Failed) != 1 || res.Failed[0].Index != 2 {
		t.Fatalf("append: %+v; want 2 applied and the invalid payload failed", res)
	}
	if n := h.Count(t, e.db, e.schema, "orders_events"); n != 2 {
		t.Fatalf("append wrote %d rows, want 2", n)
	}
}

func deadLetters(t *testing.T, h Harness) {
	e := setup(t, h)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	dl := func(id, native string) inbox.DeadLetter {
		return inbox.DeadLetter{MessageID: id, NativeID: native, Reason: "bad \x00value \xff", Class: "evaluation",
			Payload: []byte{0, 1, 2}, Headers: map[string]string{"k": "v"}, Attempts: 3, PublishedAt: at}
	}
	tx := e.begin(t)
	got, err := e.in.DeadLetter(ctx(t), tx, []inbox.DeadLetter{dl("a", "n1"), dl("b", "n2"), dl("", ""), dl("a", "n1")})
	if err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	commit(t, tx)
	if fmt.Sprint(got) != "[true true true false]" {
		t.Fatalf("inserted = %v, want [true true true false] (one row per native id)", got)
	}
	tx = e.begin(t)
	got, err = e.in.DeadLetter(ctx(t), tx, []inbox.DeadLetter{dl("a", "n1"), dl("c", "n3")})
	if err != nil {
		t.Fatalf("DeadLetter again: %v", err)
	}
	commit(t, tx)
	if fmt.Sprint(got) != "[false true]" {
		t.Fatalf("redelivered poison message: inserted = %v, want [false true]", got)
	}
	names := inbox.NamesFor(config.Sink{InboxTable: inboxTable})
	if n := h.Count(t, e.db, e.schema, names.DeadLetters); n != 4 {
		t.Fatalf("%d dead letters, want 4", n)
	}
}
