package sinkdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"regexp"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
)

// kind binds the Client's tests to one sink database kind, each case on a
// database of its own (internal/pgtest, internal/mysqltest), the way
// runtime/sink/sinktest binds the runtime's.
type kind struct {
	kind sink.Kind
	// open returns a connection string to a new empty database, another
	// spelling of it (another pool, the same database) and the schema
	// (PostgreSQL) or database (MySQL) the inbox goes in.
	open func(t *testing.T) (dsn, alias, schema string)
	// tables lists the tables of schema.
	tables func(t *testing.T, dsn, schema string) []string
	// database is what PhysicalDatabase must name.
	database *regexp.Regexp
}

var kinds = []kind{
	{
		kind: sink.Postgres,
		open: func(t *testing.T) (string, string, string) {
			dsn := pgtest.NewDatabase(t)
			return dsn, dsn + "&application_name=alias", "app"
		},
		tables: func(t *testing.T, dsn, schema string) []string {
			conn, err := pgx.Connect(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			rows, err := conn.Query(context.Background(), "SELECT tablename::text FROM pg_tables WHERE schemaname = $1", schema)
			if err != nil {
				t.Fatal(err)
			}
			names, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			return names
		},
		database: regexp.MustCompile(`^[0-9]+/idc_`),
	},
	{
		kind: sink.MySQL,
		open: func(t *testing.T) (string, string, string) {
			name, dsn := mysqltest.NewDatabase(t)
			cfg, err := gomysql.ParseDSN(dsn)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Timeout = 7 * time.Second
			return dsn, cfg.FormatDSN(), name
		},
		tables: func(t *testing.T, dsn, schema string) []string {
			db := mysqlAdmin(t)
			rows, err := db.QueryContext(context.Background(), "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME <> ?", schema, mysql.IdentityTable)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = rows.Close() }()
			var names []string
			for rows.Next() {
				var n string
				if err := rows.Scan(&n); err != nil {
					t.Fatal(err)
				}
				names = append(names, n)
			}
			return names
		},
		database: regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/idc_test_`),
	},
}

// mysqlAdmin is a root connection to the test server, closed with the test.
func mysqlAdmin(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", mysqltest.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// maxConns is the connection cap of db's pool.
func maxConns(db sink.DB) int {
	switch d := db.(type) {
	case postgres.DB:
		return int(d.Pool.Config().MaxConns)
	case *mysql.DB:
		return d.SQL().Stats().MaxOpenConnections
	}
	return -1
}

func forKinds(t *testing.T, run func(t *testing.T, k kind)) {
	for _, k := range kinds {
		t.Run(string(k.kind), func(t *testing.T) { run(t, k) })
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// The inbox's life through the Client, the same on both kinds: Ensure
// migrates once and is then ready without migrating; another spelling of
// the connection string names the same physical database; another owner
// is refused; the window state is adopted and read back; the records read
// empty; a restore marks the inbox lost; Drop is refused to a non-owner and
// drops every table for the owner.
func TestClientLifecycle(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		ctx := context.Background()
		dsn, alias, schema := k.open(t)
		c := New()
		t.Cleanup(c.Pools().Close)
		s := config.Sink{Kind: k.kind, Schema: schema, InboxTable: "orders_inbox", Layout: config.LayoutTable}
		a := inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "a", UID: "uid-a"}
		target := Target{Owner: "ns/a", DSN: dsn, Sink: s, Claim: inbox.OwnerClaim{Owner: a}}

		first, err := c.Ensure(ctx, target)
		if err != nil {
			t.Fatalf("first Ensure: %v", err)
		}
		if !first.Migrated || first.Version != inbox.SchemaVersion || first.Identity.Epoch == "" || first.Identity.Owner != a {
			t.Fatalf("first Ensure = %+v; want migrated to version %d, an epoch, owner %v", first, inbox.SchemaVersion, a)
		}
		if !k.database.MatchString(first.Identity.Database) {
			t.Fatalf("physical database %q does not match %s", first.Identity.Database, k.database)
		}
		// The pool is capped as PostgreSQL's always was.
		sp, err := c.Pools().acquire(ctx, target)
		if err != nil {
			t.Fatal(err)
		}
		if got := maxConns(sp.db); got != MaxConnsPerDatabase || cap(sp.migrations) != MaxMigrationsPerDatabase {
			t.Fatalf("the %s pool allows %d connections and %d migrations, want %d and %d", k.kind, got, cap(sp.migrations), MaxConnsPerDatabase, MaxMigrationsPerDatabase)
		}
		target.Claim.Epoch = first.Identity.Epoch
		second, err := c.Ensure(ctx, target)
		if err != nil || second.Migrated || second.Identity != first.Identity || second.Version != inbox.SchemaVersion {
			t.Fatalf("second Ensure = %+v, %v; want ready without a migration, identity %+v", second, err, first.Identity)
		}
		// Another Secret spelling the same database (another pool) names
		// the same physical database.
		via := target
		via.Owner, via.DSN = "ns/a-alias", alias
		if got, err := c.Ensure(ctx, via); err != nil || got.Identity.Database != first.Identity.Database || got.Migrated {
			t.Fatalf("Ensure through the alias = %+v, %v; want database %s, no migration", got, err, first.Identity.Database)
		}
		if c.Pools().Len() != 2 {
			t.Fatalf("%d pools open, want 2 (one per connection string)", c.Pools().Len())
		}

		b := inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "b", UID: "uid-b"}
		other := Target{Owner: "ns/b", DSN: dsn, Sink: s, Claim: inbox.OwnerClaim{Owner: b}}
		var owned *inbox.OwnedError
		if _, err := c.Ensure(ctx, other); !errors.As(err, &owned) {
			t.Fatalf("Ensure by another owner = %v, want *inbox.OwnedError", err)
		}

		now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
		derived := retention.Result{Window: 24 * time.Hour, InputsHash: "h1", Source: retention.SourceBroker, DerivedFrom: "test",
			RedeliveryHorizon: retention.Finite(23 * time.Hour), ReplayHorizon: retention.Infinite()}
		if w, err := c.StoredWindow(ctx, target); err != nil || w != nil {
			t.Fatalf("StoredWindow before adoption = %+v, %v; want none", w, err)
		}
		applied, pending, err := c.AdoptWindow(ctx, target, derived, now)
		if err != nil || pending || applied.InForce.Window != 24*time.Hour {
			t.Fatalf("AdoptWindow = %+v, %v, %v", applied, pending, err)
		}
		// A smaller window waits (the shrink rule reads the stored state).
		smaller := derived
		smaller.Window, smaller.InputsHash = time.Hour, "h2"
		if applied, pending, err = c.AdoptWindow(ctx, target, smaller, now.Add(time.Minute)); err != nil || !pending || applied.InForce.Window != 24*time.Hour {
			t.Fatalf("AdoptWindow of a smaller window = %+v, %v, %v; want 24h in force, the shrink pending", applied, pending, err)
		}
		stored, err := c.StoredWindow(ctx, target)
		if err != nil || stored == nil || stored.InForce.Window != 24*time.Hour || stored.Pending == nil || stored.Pending.Window != time.Hour {
			t.Fatalf("StoredWindow = %+v, %v", stored, err)
		}

		if run, err := c.LastPrune(ctx, target); err != nil || run != nil {
			t.Fatalf("LastPrune = %+v, %v; want none yet", run, err)
		}
		if n, err := c.IDConflicts(ctx, target); err != nil || n != 0 {
			t.Fatalf("IDConflicts = %d, %v", n, err)
		}
		if sum, err := c.RedriveSummary(ctx, target, "run-1"); err != nil || sum.Total() != 0 {
			t.Fatalf("RedriveSummary = %+v, %v", sum, err)
		}

		if err := c.MarkRestored(ctx, target, first.Identity.Epoch); err != nil {
			t.Fatalf("MarkRestored: %v", err)
		}
		var lost *inbox.LostError
		if _, err := c.Ensure(ctx, target); !errors.As(err, &lost) {
			t.Fatalf("Ensure after MarkRestored = %v, want *inbox.LostError", err)
		}

		if err := c.Drop(ctx, other); !errors.Is(err, inbox.ErrNotOwner) {
			t.Fatalf("Drop by another owner = %v, want inbox.ErrNotOwner", err)
		}
		if len(k.tables(t, dsn, schema)) == 0 {
			t.Fatal("a refused Drop dropped the tables")
		}
		if err := c.Drop(ctx, target); err != nil {
			t.Fatalf("Drop by the owner: %v", err)
		}
		if left := k.tables(t, dsn, schema); len(left) != 0 {
			t.Fatalf("tables left after Drop: %v", left)
		}
		if err := c.Drop(ctx, target); err != nil {
			t.Fatalf("Drop of what is gone: %v", err)
		}
		c.Release("ns/a")
		c.Release("ns/a-alias")
		c.Release("ns/b")
		if c.Pools().Len() != 0 || c.Pools().Owners() != 0 {
			t.Fatalf("%d pools, %d owners left after every owner let go", c.Pools().Len(), c.Pools().Owners())
		}
	})
}

// An inbox with an outbox reads its backlog on both kinds.
func TestOutboxStatsOnBothKinds(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		ctx := context.Background()
		dsn, _, schema := k.open(t)
		c := New()
		t.Cleanup(c.Pools().Close)
		target := Target{Owner: "ns/o", DSN: dsn, Outbox: true,
			Sink:  config.Sink{Kind: k.kind, Schema: schema, InboxTable: "emit_inbox", Layout: config.LayoutTable},
			Claim: inbox.OwnerClaim{Owner: inbox.Owner{Cluster: "c1", Namespace: "ns", Name: "o", UID: "uid-o"}}}
		if _, err := c.Ensure(ctx, target); err != nil {
			t.Fatal(err)
		}
		st, err := c.OutboxStats(ctx, target)
		if err != nil || st.Pending != 0 {
			t.Fatalf("OutboxStats = %+v, %v; want an empty backlog", st, err)
		}
	})
}
