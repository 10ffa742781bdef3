// Package sinktest is the conformance suite every sink dialect's tests run
// against its real database (the way runtime/source/sourcetest runs every
// broker): the claim and its duplicates, concurrent claims and deadlocks
// classified as transient, the sequence gate (a stale version in the same
// batch included), append, dead letters, progress records, the stored
// window, and Table-layout prune concurrent with claims. Each test of a
// dialect gets its own database (internal/pgtest, internal/mysqltest).
package sinktest

import (
	"context"
	"errors"
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

// Harness binds the suite to one dialect. Open is called once per case and
// must return a DB on an empty database of its own.
type Harness struct {
	// Open returns the DB and the schema (PostgreSQL) or database (MySQL)
	// the suite puts its tables in; it exists.
	Open func(t *testing.T) (db sink.DB, schema string)
	// CreateOrders creates <schema>.<table> (order_id text key, status
	// text, version bigint NULL) for the upsert, and the append target
	// <schema>.<table>_events (event_id text, order_id text).
	CreateOrders func(t *testing.T, db sink.DB, schema, table string)
	// Orders reads <schema>.<table>: order_id → (status, version; -1 for NULL).
	Orders func(t *testing.T, db sink.DB, schema, table string) map[string]Order
	// Count counts the rows of <schema>.<table>.
	Count func(t *testing.T, db sink.DB, schema, table string) int
	// Age moves the processed_at of the inbox rows of ids back by d.
	Age func(t *testing.T, db sink.DB, schema, table string, ids []string, d time.Duration)
}

// Order is one row of the orders table.
type Order struct {
	Status  string
	Version int64
}

// Run runs every case, each on its own database.
func Run(t *testing.T, h Harness) {
	t.Run("MigrateIsIdempotentAndRecordsIdentity", func(t *testing.T) { migrate(t, h) })
	t.Run("ClaimsAndDuplicates", func(t *testing.T) { claims(t, h) })
	t.Run("ConcurrentClaimsEachIDOnce", func(t *testing.T) { concurrentClaims(t, h) })
	t.Run("DeadlockIsTransient", func(t *testing.T) { deadlock(t, h) })
	t.Run("SequenceGate", func(t *testing.T) { sequenceGate(t, h) })
	t.Run("ConcurrentUpsertsKeepTheHighestVersion", func(t *testing.T) { concurrentUpserts(t, h) })
	t.Run("Append", func(t *testing.T) { appendRows(t, h) })
	t.Run("DeadLetters", func(t *testing.T) { deadLetters(t, h) })
	t.Run("ProgressRecords", func(t *testing.T) { progress(t, h) })
	t.Run("StoredWindow", func(t *testing.T) { window(t, h) })
	t.Run("NoWindowBeforeMigrate", func(t *testing.T) { windowBeforeMigrate(t, h) })
	t.Run("PruneConcurrentWithClaims", func(t *testing.T) { prune(t, h) })
}

const inboxTable = "inbox_conformance"

type env struct {
	h      Harness
	db     sink.DB
	schema string
	in     sink.Inbox
}

func setup(t *testing.T, h Harness) *env {
	t.Helper()
	db, schema := h.Open(t)
	in, err := db.Inbox(config.Sink{Schema: schema, InboxTable: inboxTable, Layout: config.LayoutTable})
	if err != nil {
		t.Fatalf("Inbox: %v", err)
	}
	if err := in.Migrate(ctx(t)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return &env{h: h, db: db, schema: schema, in: in}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func (e *env) begin(t *testing.T) sink.Tx {
	t.Helper()
	tx, err := e.db.Begin(ctx(t))
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func commit(t *testing.T, tx sink.Tx) {
	t.Helper()
	if err := tx.Commit(ctx(t)); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func claimsOf(ids ...string) []inbox.Claim {
	out := make([]inbox.Claim, len(ids))
	for i, id := range ids {
		out[i] = inbox.Claim{MessageID: id, Fingerprint: int64(len(id))}
	}
	return out
}

func (e *env) claim(t *testing.T, tx sink.Tx, ids ...string) map[string]struct{} {
	t.Helper()
	fresh, err := e.in.Claim(ctx(t), tx, claimsOf(ids...))
	if err != nil {
		t.Fatalf("Claim(%v): %v", ids, err)
	}
	return fresh
}

func wantSet(t *testing.T, what string, got map[string]struct{}, want ...string) {
	t.Helper()
	ok := len(got) == len(want)
	for _, w := range want {
		if _, in := got[w]; !in {
			ok = false
		}
	}
	if !ok {
		t.Fatalf("%s: got %v, want %v", what, keys(got), want)
	}
}

func keys(m map[string]struct{}) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func migrate(t *testing.T, h Harness) {
	e := setup(t, h)
	c := ctx(t)
	if err := e.in.Migrate(c); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if v, err := e.in.SchemaVersion(c); err != nil || v != inbox.SchemaVersion {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, inbox.SchemaVersion)
	}
	a := inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "a", UID: "u1"}
	id, err := e.in.MigrateFor(c, &inbox.OwnerClaim{Owner: a})
	if err != nil || id.Epoch == "" || id.Owner != a {
		t.Fatalf("MigrateFor(a) = %+v, %v; want owner a and an epoch", id, err)
	}
	again, err := e.in.MigrateFor(c, &inbox.OwnerClaim{Owner: a, Epoch: id.Epoch})
	if err != nil || again.Epoch != id.Epoch {
		t.Fatalf("MigrateFor(a) again = %+v, %v; want the same epoch %s", again, err, id.Epoch)
	}
	_, err = e.in.MigrateFor(c, &inbox.OwnerClaim{Owner: inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "b", UID: "u2"}})
	var owned *inbox.OwnedError
	if !errors.As(err, &owned) || owned.Owner != a {
		t.Fatalf("MigrateFor(b) = %v; want an OwnedError naming a", err)
	}
	if err := e.in.Drop(c); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	if v, err := e.in.SchemaVersion(c); err != nil || v != 0 {
		t.Fatalf("SchemaVersion after Drop = %d, %v; want 0", v, err)
	}
	_, err = e.in.MigrateFor(c, &inbox.OwnerClaim{Owner: a, Epoch: id.Epoch})
	if !inbox.IsLost(err) {
		t.Fatalf("MigrateFor after Drop with the old epoch = %v; want a LostError", err)
	}
}

func claims(t *testing.T, h Harness) {
	e := setup(t, h)
	tx := e.begin(t)
	wantSet(t, "first claim (a repeated in the batch)", e.claim(t, tx, "b", "a", "a"), "a", "b")
	wantSet(t, "same ids in the same transaction", e.claim(t, tx, "a", "b"))
	commit(t, tx)

	tx = e.begin(t)
	wantSet(t, "claim after commit", e.claim(t, tx, "b", "c"), "c")
	if err := tx.Rollback(ctx(t)); err != nil {
		t.Fatal(err)
	}
	tx = e.begin(t)
	wantSet(t, "a rolled-back claim is not kept", e.claim(t, tx, "c"), "c")
	if err := e.in.Unclaim(ctx(t), tx, []string{"c"}); err != nil {
		t.Fatalf("Unclaim: %v", err)
	}
	commit(t, tx)
	tx = e.begin(t)
	wantSet(t, "an unclaimed id is new again", e.claim(t, tx, "c", "a"), "c")
	wantSet(t, "no ids", e.claim(t, tx))
	commit(t, tx)

	// A second transaction claiming an id the first holds uncommitted waits
	// for it, then skips it.
	first := e.begin(t)
	wantSet(t, "holder", e.claim(t, first, "x", "y"), "x", "y")
	got := make(chan map[string]struct{}, 1)
	go func() {
		tx, err := e.db.Begin(context.Background())
		if err != nil {
			got <- nil
			return
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		fresh, err := e.in.Claim(context.Background(), tx, claimsOf("y", "z"))
		if err != nil || tx.Commit(context.Background()) != nil {
			got <- nil
			return
		}
		got <- fresh
	}()
	commit(t, first)
	wantSet(t, "claim that waited for the holder", <-got, "z")
	if _, err := e.in.Claim(ctx(t), fakeTx{}, claimsOf("q")); !errors.Is(err, sink.ErrForeignTx) {
		t.Fatalf("Claim with another dialect's tx = %v; want ErrForeignTx", err)
	}
}

type fakeTx struct{}

func (fakeTx) Commit(context.Context) error   { return nil }
func (fakeTx) Rollback(context.Context) error { return nil }

// concurrentClaims: workers claim overlapping batches of neighbouring ids at
// once (the pattern that deadlocks on gap locks at REPEATABLE READ); every
// failure must be transient, and each id is new exactly once.
func concurrentClaims(t *testing.T, h Harness) {
	e := setup(t, h)
	const workers, batches, size, ids = 4, 25, 40, 300
	var mu sync.Mutex
	newCount := map[string]int{}
	transient := 0
	var firstTransient error
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for b := range batches {
				batch := make([]string, size)
				for i := range batch {
					batch[i] = fmt.Sprintf("id-%04d", (w*7+b*13+i*3)%ids)
				}
				fresh, retried, err := e.claimRetrying(batch)
				mu.Lock()
				for id := range fresh {
					newCount[id]++
				}
				transient += len(retried)
				if firstTransient == nil && len(retried) > 0 {
					firstTransient = retried[0]
				}
				mu.Unlock()
				if err != nil {
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
	for id, n := range newCount {
		if n != 1 {
			t.Errorf("id %s was new %d times", id, n)
		}
	}
	if got := h.Count(t, e.db, e.schema, inboxTable); got != len(newCount) {
		t.Errorf("inbox holds %d rows, %d ids were new", got, len(newCount))
	}
	t.Logf("%d distinct ids claimed; %d transient failures retried (first: %v)", len(newCount), transient, firstTransient)
}

// claimRetrying claims ids in their own transaction, retrying what the
// dialect classifies as transient (returned in retried); any other failure
// is returned.
func (e *env) claimRetrying(ids []string) (fresh map[string]struct{}, retried []error, err error) {
	for {
		fresh, err := e.claimOnce(ids)
		if err == nil {
			return fresh, retried, nil
		}
		if class, _ := e.db.Classify(err); class != sink.ClassUnavailable {
			return nil, retried, fmt.Errorf("claim failed with a non-transient error (class %d): %w", class, err)
		}
		retried = append(retried, err)
	}
}

func (e *env) claimOnce(ids []string) (map[string]struct{}, error) {
	c := context.Background()
	tx, err := e.db.Begin(c)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(c) }()
	fresh, err := e.in.Claim(c, tx, claimsOf(ids...))
	if err != nil {
		return nil, err
	}
	return fresh, tx.Commit(c)
}

// deadlock provokes a real deadlock between two claims taken in opposite
// orders across statements: the database breaks it, and the error it gives
// the victim is transient (retried, never a message's fault).
func deadlock(t *testing.T, h Harness) {
	e := setup(t, h)
	t1, t2 := e.begin(t), e.begin(t)
	e.claim(t, t1, "m1")
	e.claim(t, t2, "m2")
	errc := make(chan error, 1)
	go func() {
		_, err := e.in.Claim(context.Background(), t1, claimsOf("m2"))
		if err != nil {
			_ = t1.Rollback(context.Background()) // PostgreSQL keeps a failed transaction's locks until then
		}
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond) // let t1 queue behind t2 (the test passes either way)
	_, err2 := e.in.Claim(ctx(t), t2, claimsOf("m1"))
	_ = t2.Rollback(ctx(t))
	err1 := <-errc
	victim := err1
	if victim == nil {
		victim = err2
	}
	if victim == nil {
		t.Fatal("neither claim failed: no deadlock was detected")
	}
	if class, _ := e.db.Classify(victim); class != sink.ClassUnavailable {
		t.Fatalf("deadlock %v classified as %d, want ClassUnavailable (transient)", victim, class)
	}
}

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

func progress(t *testing.T, h Harness) {
	e := setup(t, h)
	r := e.heartbeats(t)
	back := e.staleAndBack(t, r)
	e.retire(t, r, back)
}

// heartbeats writes two replicas' rows and checks r1's, which it returns.
func (e *env) heartbeats(t *testing.T) inbox.ProgressRecord {
	c := ctx(t)
	created := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	consumer := &inbox.ConsumerIdentity{Kind: "NATSJetStream", Name: "S/d", Created: &created}
	commitAge, unackedAge := 2*time.Second, 5*time.Second
	if err := e.in.WriteHeartbeat(c, inbox.Heartbeat{Replica: "r1", LastCommitAge: &commitAge, UnackedAge: &unackedAge,
		Positions: map[string]int64{"S": 7}, Consumer: consumer}); err != nil {
		t.Fatalf("WriteHeartbeat: %v", err)
	}
	if err := e.in.WriteHeartbeat(c, inbox.Heartbeat{Replica: "r2", Stopped: true}); err != nil {
		t.Fatalf("WriteHeartbeat r2: %v", err)
	}
	now, recs, err := e.in.Progress(c)
	if err != nil || len(recs) != 2 {
		t.Fatalf("Progress = %d rows, %v; want 2", len(recs), err)
	}
	r := recs[0]
	if r.Replica != "r1" {
		r = recs[1]
	}
	if r.HeartbeatAt.After(now) || r.LastCommitAt == nil || r.UnackedSince == nil {
		t.Fatalf("r1 = %+v at database time %s", r, now)
	}
	// One statement, one database clock: the ages are exact.
	if d := r.HeartbeatAt.Sub(*r.UnackedSince); d != unackedAge {
		t.Errorf("heartbeat - unacked_since = %s, want %s", d, unackedAge)
	}
	if d := r.HeartbeatAt.Sub(*r.LastCommitAt); d != commitAge {
		t.Errorf("heartbeat - last_commit_at = %s, want %s", d, commitAge)
	}
	if r.Positions["S"] != 7 || r.Consumer == nil || !r.Consumer.Same(*consumer) || r.Stopped {
		t.Errorf("r1 = %+v (consumer %+v)", r, r.Consumer)
	}
	return r
}

// staleAndBack marks r stale, then has the replica heartbeat again, and
// returns the row as it reads then.
func (e *env) staleAndBack(t *testing.T, r inbox.ProgressRecord) inbox.ProgressRecord {
	c := ctx(t)
	if err := e.in.MarkStale(c, r, map[string]int64{"S": 9}); err != nil {
		t.Fatalf("MarkStale: %v", err)
	}
	if err := e.in.MarkStale(c, r, map[string]int64{"S": 10}); !inbox.IsProgressMoved(err) {
		t.Fatalf("MarkStale twice = %v; want IsProgressMoved", err)
	}
	_, recs, _ := e.in.Progress(c)
	for _, x := range recs {
		if x.Replica == "r1" && (x.StaleSince == nil || x.SettleMark["S"] != 9) {
			t.Errorf("after MarkStale: %+v", x)
		}
	}
	// The replica comes back: the mark is cleared, its consumer kept.
	if err := e.in.WriteHeartbeat(c, inbox.Heartbeat{Replica: "r1"}); err != nil {
		t.Fatal(err)
	}
	_, recs, _ = e.in.Progress(c)
	var back inbox.ProgressRecord
	for _, x := range recs {
		if x.Replica == "r1" {
			back = x
		}
	}
	if back.StaleSince != nil || back.SettleMark != nil || back.Consumer == nil || back.UnackedSince != nil {
		t.Errorf("after a new heartbeat: %+v", back)
	}
	if err := e.in.MarkStale(c, r, nil); !inbox.IsProgressMoved(err) {
		t.Errorf("MarkStale with the old read = %v; want IsProgressMoved", err)
	}
	return back
}

// retire retires r1 by an old read (kept) and by the current one (gone).
func (e *env) retire(t *testing.T, r, back inbox.ProgressRecord) {
	c := ctx(t)
	var recs []inbox.ProgressRecord
	if err := e.in.RetireProgress(c, r); err != nil {
		t.Fatal(err)
	}
	if _, recs, _ = e.in.Progress(c); len(recs) != 2 {
		t.Errorf("RetireProgress with an old read removed the row: %d rows", len(recs))
	}
	if err := e.in.RetireProgress(c, back); err != nil {
		t.Fatal(err)
	}
	if _, recs, _ = e.in.Progress(c); len(recs) != 1 || recs[0].Replica != "r2" || !recs[0].Stopped {
		t.Errorf("after RetireProgress: %+v", recs)
	}
}

func window(t *testing.T, h Harness) {
	e := setup(t, h)
	c := ctx(t)
	if st, err := e.in.ReadWindow(c); err != nil || st != nil {
		t.Fatalf("ReadWindow on a new inbox = %+v, %v; want nil", st, err)
	}
	since := time.Date(2026, 3, 4, 5, 6, 7, 891000000, time.UTC)
	stored, err := e.in.UpdateWindow(c, func(cur *inbox.WindowState) (*inbox.WindowState, error) {
		if cur != nil {
			return nil, fmt.Errorf("current = %+v, want nil", cur)
		}
		return &inbox.WindowState{Window: 2*time.Hour + time.Microsecond, InputsHash: "h1", Source: "Broker", DerivedFrom: "stream S max_age=2h",
			RedeliveryHorizon: "1h", ReplayHorizon: "2h", AdoptedAt: since, PendingWindow: time.Hour, PendingSince: &since}, nil
	})
	if err != nil {
		t.Fatalf("UpdateWindow: %v", err)
	}
	read, err := e.in.ReadWindow(c)
	if err != nil || read == nil {
		t.Fatalf("ReadWindow = %+v, %v", read, err)
	}
	for _, st := range []*inbox.WindowState{stored, read} {
		if st.Window != 2*time.Hour+time.Millisecond || st.PendingWindow != time.Hour || st.PendingSince == nil ||
			!st.PendingSince.Equal(since) || !st.AdoptedAt.Equal(since) || st.InputsHash != "h1" || st.UpdatedAt.IsZero() {
			t.Errorf("stored window = %+v (rounded up to the millisecond, pending kept)", st)
		}
	}
	if _, err := e.in.UpdateWindow(c, func(*inbox.WindowState) (*inbox.WindowState, error) { return nil, nil }); err != nil {
		t.Fatalf("UpdateWindow(nil): %v", err)
	}
	// Concurrent read-modify-writes take turns: none is lost.
	const writers = 6
	e.concurrentWindowUpdates(t, writers)
	read, _ = e.in.ReadWindow(c)
	if want := 2*time.Hour + time.Millisecond + writers*time.Second; read.Window != want || read.PendingSince != nil {
		t.Fatalf("after %d concurrent updates: window %s pending %v, want %s and no pending shrink", writers, read.Window, read.PendingSince, want)
	}
}

// windowBeforeMigrate: an inbox not migrated yet stores no window; an
// update says to migrate first.
func windowBeforeMigrate(t *testing.T, h Harness) {
	db, schema := h.Open(t)
	in, err := db.Inbox(config.Sink{Schema: schema, InboxTable: inboxTable, Layout: config.LayoutTable})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := in.ReadWindow(ctx(t)); st != nil || err != nil {
		t.Fatalf("ReadWindow before Migrate = %+v, %v; want nil, nil", st, err)
	}
	_, err = in.UpdateWindow(ctx(t), func(*inbox.WindowState) (*inbox.WindowState, error) {
		return &inbox.WindowState{Window: time.Hour}, nil
	})
	if !errors.Is(err, inbox.ErrNoWindowTable) {
		t.Fatalf("UpdateWindow before Migrate = %v; want ErrNoWindowTable", err)
	}
}

// concurrentWindowUpdates has writers add a second to the window at once.
func (e *env) concurrentWindowUpdates(t *testing.T, writers int) {
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Go(func() {
			_, err := e.in.UpdateWindow(context.Background(), func(cur *inbox.WindowState) (*inbox.WindowState, error) {
				next := *cur
				next.Window += time.Second
				next.PendingWindow, next.PendingSince = 0, nil
				return &next, nil
			})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent UpdateWindow: %v", err)
		}
	}
}

// claimWhile claims a new id and two young ones per transaction until stop
// closes; a young id claimed as new, or a non-transient failure, is an error.
func (e *env) claimWhile(stop <-chan struct{}, w int, young []string) error {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		dup := young[i%len(young)]
		fresh, _, err := e.claimRetrying([]string{fmt.Sprintf("new-%d-%04d", w, i), dup, young[(i*7)%len(young)]})
		if err != nil {
			return err
		}
		if _, ok := fresh[dup]; ok {
			return fmt.Errorf("young id %s was claimed as new during the prune", dup)
		}
	}
}

// prune: ids aged past the window are deleted in batches while other
// transactions claim (new ids and duplicates of young ones) and one holds an
// uncommitted claim; young ids all stay, a hold caps the cutoff, and every
// run is recorded.
func prune(t *testing.T, h Harness) {
	e := setup(t, h)
	c := ctx(t)
	var old, older, young []string
	for i := range 60 {
		old = append(old, fmt.Sprintf("old-%03d", i))
		older = append(older, fmt.Sprintf("older-%03d", i))
		young = append(young, fmt.Sprintf("young-%03d", i))
	}
	tx := e.begin(t)
	e.claim(t, tx, append(append(append([]string{}, old...), older...), young...)...)
	commit(t, tx)
	h.Age(t, e.db, e.schema, inboxTable, old, 90*time.Minute)
	h.Age(t, e.db, e.schema, inboxTable, older, 3*time.Hour)

	// A hold two hours back keeps the ids aged 90 minutes.
	now, _, err := e.in.Progress(c)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.in.PruneTable(c, inbox.Bound{Window: time.Hour, HoldAt: now.Add(-2 * time.Hour), HeldReason: "replica r1 gone",
		HeldSince: now.Add(-time.Minute)}, 7, time.Minute)
	if err != nil || res.RowsDeleted != int64(len(older)) || !res.Cutoff.Before(res.WindowCutoff) {
		t.Fatalf("held prune = %+v, %v; want %d deleted below the hold", res, err, len(older))
	}
	run, err := e.in.LastPruneRun(c)
	if err != nil || run == nil || run.HeldReason != "replica r1 gone" || run.RowsDeleted != int64(len(older)) || run.FinishedAt == nil || run.Window != time.Hour {
		t.Fatalf("LastPruneRun = %+v, %v", run, err)
	}

	// An uncommitted claim is held open while the prune runs: it must not
	// wait for it.
	holder := e.begin(t)
	wantSet(t, "holder", e.claim(t, holder, "held-1", "held-2"), "held-1", "held-2")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	claimErrs := make(chan error, 2)
	for w := range 2 {
		wg.Go(func() { claimErrs <- e.claimWhile(stop, w, young) })
	}
	pc, cancel := context.WithTimeout(c, 30*time.Second)
	defer cancel()
	res, err = e.in.PruneTable(pc, inbox.Bound{Window: time.Hour}, 7, time.Minute)
	close(stop)
	wg.Wait()
	close(claimErrs)
	for err := range claimErrs {
		if err != nil {
			t.Fatalf("claim during the prune: %v", err)
		}
	}
	if err != nil || res.RowsDeleted != int64(len(old)) || !res.Cutoff.Equal(res.WindowCutoff) {
		t.Fatalf("prune = %+v, %v; want the %d ids aged 90 minutes deleted", res, err, len(old))
	}
	commit(t, holder)
	tx = e.begin(t)
	wantSet(t, "pruned ids are new again; young and held ones are not", e.claim(t, tx, old[0], older[0], young[0], "held-1"), old[0], older[0])
	commit(t, tx)
}
