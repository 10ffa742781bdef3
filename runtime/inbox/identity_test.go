package inbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

var (
	ownerA      = Owner{Cluster: "c1", Namespace: "team-a", Name: "orders", UID: "uid-a"}
	ownerB      = Owner{Cluster: "c1", Namespace: "tenant-b", Name: "orders", UID: "uid-b"}
	ownerAAgain = Owner{Cluster: "c1", Namespace: "team-a", Name: "orders", UID: "uid-a2"}
)

func identityStore(t *testing.T, pool *pgxpool.Pool, layout config.Layout, opts ...Option) *Store {
	t.Helper()
	s, err := New(pool, config.Sink{Schema: "app", InboxTable: "inbox_orders", Layout: layout}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func claimIDs(t *testing.T, pool *pgxpool.Pool, s *Store, ids ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	claims := make([]Claim, len(ids))
	for i, id := range ids {
		claims[i] = Claim{MessageID: id, PublishedAt: time.Now()}
	}
	if _, err := s.Claim(ctx, tx, claims); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// An inbox records its owner and epoch; a second resource reaching the
// same table (another namespace, any Secret) is refused naming the owner;
// the same namespace/name (a restore without status, a replace) adopts;
// anyone else adopts only by naming the owner.
func TestInboxOwnership(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, "CREATE SCHEMA app")
	s := identityStore(t, pool, config.LayoutTable)

	idA, err := s.MigrateFor(ctx, &OwnerClaim{Owner: ownerA})
	if err != nil {
		t.Fatal(err)
	}
	if db, err := PhysicalDatabase(ctx, pool); err != nil || !strings.Contains(db, "/") || strings.HasPrefix(db, "unknown/") {
		t.Fatalf("PhysicalDatabase = %q, %v", db, err)
	}
	if idA.Owner != ownerA || len(idA.Epoch) != 32 {
		t.Fatalf("identity after creation: %+v", idA)
	}
	if _, v, ready, err := s.Check(ctx, OwnerClaim{Owner: ownerA, Epoch: idA.Epoch}); err != nil || !ready || v != SchemaVersion {
		t.Fatalf("Check by the owner: version %d ready %v err %v", v, ready, err)
	}
	claimIDs(t, pool, s, "m-1", "m-2")

	var owned *OwnedError
	if _, _, _, err := s.Check(ctx, OwnerClaim{Owner: ownerB}); !errors.As(err, &owned) || owned.Owner != ownerA {
		t.Fatalf("Check by another resource = %v, want an OwnedError naming %v", err, ownerA)
	}
	_, err = s.MigrateFor(ctx, &OwnerClaim{Owner: ownerB})
	if !errors.As(err, &owned) {
		t.Fatalf("MigrateFor by another resource = %v, want an OwnedError", err)
	}
	if !strings.Contains(err.Error(), "team-a/orders") {
		t.Fatalf("the refusal does not name the owner: %v", err)
	}
	if err := s.DropOwned(ctx, ownerB); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("DropOwned by another resource = %v, want ErrNotOwner", err)
	}
	if n := countRows(t, pool, "app.inbox_orders"); n != 2 {
		t.Fatalf("%d inbox rows after a refused drop, want 2", n)
	}

	// Restored without status, or replaced: same namespace/name, new UID.
	if _, _, ready, err := s.Check(ctx, OwnerClaim{Owner: ownerAAgain}); err != nil || ready {
		t.Fatalf("Check by the same name with a new UID: ready %v err %v (want not ready, no error)", ready, err)
	}
	id, err := s.MigrateFor(ctx, &OwnerClaim{Owner: ownerAAgain})
	if err != nil || id.Owner != ownerAAgain || id.Epoch != idA.Epoch {
		t.Fatalf("adoption by the same name: %+v, %v (epoch must stay %s)", id, err, idA.Epoch)
	}
	if err := s.DropOwned(ctx, ownerA); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("DropOwned by the old UID = %v, want ErrNotOwner", err)
	}

	// Adoption by name.
	id, err = s.MigrateFor(ctx, &OwnerClaim{Owner: ownerB, AdoptFrom: ownerAAgain.Ref()})
	if err != nil || id.Owner != ownerB || id.Epoch != idA.Epoch {
		t.Fatalf("adoption naming the owner: %+v, %v", id, err)
	}
	if n := countRows(t, pool, "app.inbox_orders"); n != 2 {
		t.Fatalf("%d inbox rows after adoption, want 2: claims are kept", n)
	}
	if err := s.DropOwned(ctx, ownerB); err != nil {
		t.Fatalf("DropOwned by the owner: %v", err)
	}
	if exists, _ := s.tableExists(ctx, s.meta, "meta"); exists {
		t.Fatal("the owner's drop left the meta table")
	}
}

// A lost inbox fails closed: dropped, truncated or re-created, the claim
// the controller makes with the epoch it knows is refused with what was
// lost, nothing is created, and only an accepted loss mints a new epoch.
func TestLostInboxFailsClosed(t *testing.T) {
	ctx := context.Background()
	for _, layout := range []config.Layout{config.LayoutTable, config.LayoutPartitioned} {
		for _, tc := range []struct {
			name, what string
			lose       []string
		}{
			{"dropped", "do not exist", []string{"DROP TABLE app.inbox_orders, app.inbox_orders_meta"}},
			{"inbox table dropped", "inbox table does not exist", []string{"DROP TABLE app.inbox_orders"}},
			{"truncated", "was truncated", []string{"TRUNCATE app.inbox_orders"}},
			{"partition truncated", "was truncated", []string{"TRUNCATE app.PARTITION"}},
			{"re-created", "records epoch", []string{"UPDATE app.inbox_orders_meta SET epoch = 'feedfeedfeedfeedfeedfeedfeedfeed'"}},
			{"restored older", "older than this resource's record", nil},
		} {
			if tc.name == "partition truncated" && layout != config.LayoutPartitioned {
				continue
			}
			t.Run(string(layout)+"/"+tc.name, func(t *testing.T) {
				pool, _ := pgtest.NewPool(t)
				pgtest.Exec(t, pool, "CREATE SCHEMA app")
				s := identityStore(t, pool, layout)
				id, err := s.MigrateFor(ctx, &OwnerClaim{Owner: ownerA})
				if err != nil {
					t.Fatal(err)
				}
				if layout == config.LayoutPartitioned {
					if err := s.EnsurePartitions(ctx, Day(time.Now()), 1); err != nil {
						t.Fatal(err)
					}
				}
				runtimeStore := identityStore(t, pool, layout, WithExpectedEpoch(id.Epoch))
				if err := runtimeStore.Verify(ctx); err != nil {
					t.Fatalf("Verify of an intact inbox: %v", err)
				}
				if tc.lose == nil {
					if err := s.MarkRestored(ctx, id.Epoch); err != nil {
						t.Fatal(err)
					}
				}
				for _, stmt := range tc.lose {
					pgtest.Exec(t, pool, strings.ReplaceAll(stmt, "PARTITION", s.PartitionName(Day(time.Now()))))
				}

				var lost *LostError
				if _, _, _, err := s.Check(ctx, OwnerClaim{Owner: ownerA, Epoch: id.Epoch}); !errors.As(err, &lost) || !strings.Contains(lost.What, tc.what) {
					t.Fatalf("Check = %v, want a LostError saying %q", err, tc.what)
				}
				if _, err := s.MigrateFor(ctx, &OwnerClaim{Owner: ownerA, Epoch: id.Epoch}); !IsLost(err) {
					t.Fatalf("MigrateFor = %v, want a LostError", err)
				}
				if err := runtimeStore.Verify(ctx); !IsLost(err) {
					t.Fatalf("the runtime's Verify = %v, want a LostError", err)
				}
				if err := runtimeStore.Migrate(ctx); !IsLost(err) {
					t.Fatalf("the runtime's Migrate = %v, want a LostError", err)
				}
				if tc.name == "dropped" {
					if exists, _ := s.tableExists(ctx, s.inbox, "inbox"); exists {
						t.Fatal("a refused migration re-created the inbox")
					}
				}
				accepted, err := s.MigrateFor(ctx, &OwnerClaim{Owner: ownerA, Epoch: id.Epoch, AcceptLoss: true})
				if err != nil || accepted.Epoch == "" || accepted.Epoch == id.Epoch {
					t.Fatalf("accepting the loss: %+v, %v (want a new epoch)", accepted, err)
				}
				if _, _, ready, err := s.Check(ctx, OwnerClaim{Owner: ownerA, Epoch: accepted.Epoch}); err != nil || !ready {
					t.Fatalf("Check after accepting: ready %v err %v", ready, err)
				}
				if err := identityStore(t, pool, layout, WithExpectedEpoch(accepted.Epoch)).Verify(ctx); err != nil {
					t.Fatalf("Verify with the new epoch: %v", err)
				}
			})
		}
	}
}

// An inbox of schema version 6 (no owner, no epoch) is claimed by the
// first resource that reaches it, given an epoch and marker, and keeps its
// claims; a runtime expecting no epoch keeps working on it.
func TestUpgradeFromVersion6RecordsOwnerAndEpoch(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, "CREATE SCHEMA app")
	s := identityStore(t, pool, config.LayoutTable)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	epoch, err := s.Epoch(ctx)
	if err != nil || epoch == "" {
		t.Fatalf("a runtime-created inbox has epoch %q (%v)", epoch, err)
	}
	claimIDs(t, pool, s, "m-1")
	// What version 6 left: no owner, no epoch columns, no marker.
	pgtest.Exec(t, pool, "DROP FUNCTION app.inbox_orders_truncated() CASCADE",
		"ALTER TABLE app.inbox_orders_meta DROP COLUMN owner_cluster, DROP COLUMN owner_namespace, DROP COLUMN owner_name, DROP COLUMN owner_uid, DROP COLUMN epoch",
		"UPDATE app.inbox_orders_meta SET schema_version = 6")
	if v, up, err := s.UpToDate(ctx); err != nil || up || v != 6 {
		t.Fatalf("UpToDate on a version 6 inbox: %d %v %v", v, up, err)
	}
	id, err := s.MigrateFor(ctx, &OwnerClaim{Owner: ownerA})
	if err != nil || id.Owner != ownerA || id.Epoch == "" {
		t.Fatalf("upgrading: %+v %v", id, err)
	}
	if v, _ := s.SchemaVersion(ctx); v != SchemaVersion {
		t.Fatalf("schema version %d after the upgrade", v)
	}
	if n := countRows(t, pool, "app.inbox_orders"); n != 1 {
		t.Fatalf("%d rows after the upgrade, want the claim", n)
	}
	if _, _, ready, err := s.Check(ctx, OwnerClaim{Owner: ownerA, Epoch: id.Epoch}); err != nil || !ready {
		t.Fatalf("Check after the upgrade: %v %v", ready, err)
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
