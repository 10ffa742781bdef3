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
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
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
	// OpenAs opens db's database (schema) as a new login holding only the
	// grants the dialect documents for the runtime on the inbox names in
	// layout with the optional tables opts asks for (RuntimeGrants with
	// opts), less the privilege without (none when it is the zero Revoke);
	// the login is removed when the test ends.
	OpenAs func(t *testing.T, db sink.DB, schema string, names inbox.Names, layout config.Layout, without Revoke, opts ...inbox.Option) sink.DB
	// Advice is the GRANT statement the error err (from db) names, "" for
	// none.
	Advice func(db sink.DB, err error) string
}

// Revoke is one privilege on one of the inbox's tables (unqualified) that
// OpenAs takes back after the runtime's grants.
type Revoke struct{ Privilege, Table string }

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
	// Identity, stats, the Partitioned layout, least privilege (h2-myparts).
	t.Run("Identity", func(t *testing.T) { identity(t, h) })
	t.Run("Stats", func(t *testing.T) { stats(t, h) })
	t.Run("PartitionedClaimsOncePerID", func(t *testing.T) { partitionedClaims(t, h) })
	t.Run("PrunePartitionsConcurrentWithClaims", func(t *testing.T) { prunePartitioned(t, h) })
	t.Run("LeastPrivilege", func(t *testing.T) { leastPrivilege(t, h) })
	// The outbox and relay, dead letters and redrive, conflicts, sql.
	t.Run("OutboxAndRelay", func(t *testing.T) { outbox(t, h) })
	t.Run("OutboxAndRedrivesTablesOnDemand", func(t *testing.T) { outboxAbsent(t, h) })
	t.Run("ConcurrentRelaysEachEventOnceInOrder", func(t *testing.T) { concurrentRelays(t, h) })
	t.Run("DeadLetterListing", func(t *testing.T) { deadLetterListing(t, h) })
	t.Run("RedriveExactlyOnce", func(t *testing.T) { redrive(t, h) })
	t.Run("ConcurrentRedrivesSettleEachOnce", func(t *testing.T) { concurrentRedrives(t, h) })
	t.Run("IDConflictsAndExisting", func(t *testing.T) { idConflicts(t, h) })
	t.Run("SQLEffectNamedParams", func(t *testing.T) { sqlEffect(t, h) })
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
