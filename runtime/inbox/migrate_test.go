package inbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			ctx := context.Background()
			pool, _ := pgtest.NewPool(t)
			s := newStore(t, pool, layout)
			if v, err := s.SchemaVersion(ctx); err != nil || v != 0 {
				t.Fatalf("SchemaVersion before migrate = %d, %v; want 0", v, err)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 3)
			for range 3 {
				wg.Go(func() { errs <- s.Migrate(ctx) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("concurrent migrate: %v", err)
				}
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("second migrate: %v", err)
			}
			if v, err := s.SchemaVersion(ctx); err != nil || v != SchemaVersion {
				t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, SchemaVersion)
			}
			other := config.LayoutPartitioned
			if layout == other {
				other = config.LayoutTable
			}
			if err := newStore(t, pool, other).Migrate(ctx); err == nil {
				t.Fatalf("migrating a %s inbox as %s must fail", layout, other)
			}
			for _, table := range []string{"inbox_orders", "inbox_orders_dead_letters", "inbox_orders_prune_runs", "inbox_orders_meta"} {
				var ok bool
				if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", "idc."+table).Scan(&ok); err != nil || !ok {
					t.Errorf("table idc.%s missing after migrate (%v)", table, err)
				}
			}
		})
	}
}

// schemaTables lists the tables of schema idc, sorted.
func schemaTables(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var created []string
	rows, err := pool.Query(context.Background(), "SELECT tablename FROM pg_tables WHERE schemaname = 'idc' ORDER BY tablename")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		created = append(created, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return created
}

// Names.Provisioned is the inbox's own list of the tables Migrate creates
// for its options (the benchmarks count on it), and Names.Tables, which
// admission reserves, is every table any option creates.
func TestNamesProvisionedListsWhatMigrateCreates(t *testing.T) {
	for _, o := range []Options{{}, {Outbox: true}, {Redrives: true}, {Outbox: true, Redrives: true}} {
		t.Run(fmt.Sprintf("outbox=%v,redrives=%v", o.Outbox, o.Redrives), func(t *testing.T) {
			pool, _ := pgtest.NewPool(t)
			opts := []Option{WithOutbox(o.Outbox)}
			if o.Redrives {
				opts = append(opts, WithRedrives())
			}
			s := newStore(t, pool, config.LayoutTable, opts...)
			if err := s.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			listed := slices.Clone(s.Names().Provisioned(o))
			slices.Sort(listed)
			if created := schemaTables(t, pool); !slices.Equal(created, listed) {
				t.Fatalf("Migrate created %v, Names.Provisioned lists %v", created, listed)
			}
			if o.Outbox && o.Redrives && !slices.Equal(listed, slices.Sorted(slices.Values(s.Names().Tables()))) {
				t.Fatalf("with every option Migrate created %v, Names.Tables lists %v", listed, s.Names().Tables())
			}
		})
	}
}

// An inbox migrated without the optional tables gets each one when a store
// that uses it migrates (a resource that adds spec.emit, the first
// redrive), at the same schema version and without touching the tables it
// has; until then UpToDate says the migration is due.
func TestOptionalTablesAreCreatedWhenFirstUsed(t *testing.T) {
	ctx := context.Background()
	pool, dsn := pgtest.NewPool(t)
	plain := newStore(t, pool, config.LayoutTable)
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	n := plain.Names()
	if got := schemaTables(t, pool); slices.Contains(got, n.Outbox) || slices.Contains(got, n.Redrives) {
		t.Fatalf("an inbox without options has %v: no outbox nor redrives log expected", got)
	}
	if v, ok, err := plain.UpToDate(ctx); err != nil || !ok || v != SchemaVersion {
		t.Fatalf("plain store UpToDate = %d, %v, %v; want %d, true", v, ok, err, SchemaVersion)
	}
	// What the store without the tables reads of them is empty, not an
	// error, also on a pool that runs statements unprepared as the
	// controller's do (a missing table then shows only in rows.Err).
	if sum, err := plain.RedriveSummary(ctx, "never"); err != nil || len(sum.Outcomes) != 0 {
		t.Fatalf("RedriveSummary without the log = %+v, %v; want empty", sum, err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	execPool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer execPool.Close()
	if sum, err := newStore(t, execPool, config.LayoutTable).RedriveSummary(ctx, "never"); err != nil || len(sum.Outcomes) != 0 {
		t.Fatalf("RedriveSummary without the log on an unprepared-statement pool = %+v, %v; want empty", sum, err)
	}
	if n, err := plain.PruneOutbox(ctx, time.Hour, 100, time.Second); err != nil || n != 0 {
		t.Fatalf("PruneOutbox without the outbox = %d, %v; want 0, nil", n, err)
	}

	emitting := newStore(t, pool, config.LayoutTable, WithOutbox(true), WithRedrives())
	if _, ok, err := emitting.UpToDate(ctx); err != nil || ok {
		t.Fatalf("a store that uses the outbox on an inbox without one: UpToDate = %v, %v; want false", ok, err)
	}
	// A live replica holding a row lock on the inbox must not block the
	// creation: no DDL touches the existing tables.
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `INSERT INTO `+plain.QualifiedInbox()+` (message_id) VALUES ('held')`); err != nil {
		t.Fatal(err)
	}
	migrateCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := emitting.Migrate(migrateCtx); err != nil {
		t.Fatalf("creating the optional tables while a replica writes the inbox: %v", err)
	}
	if got := schemaTables(t, pool); !slices.Contains(got, n.Outbox) || !slices.Contains(got, n.Redrives) {
		t.Fatalf("after migrating with both options the schema has %v", got)
	}
	if v, ok, err := emitting.UpToDate(ctx); err != nil || !ok || v != SchemaVersion {
		t.Fatalf("after creating them UpToDate = %d, %v, %v; want %d, true", v, ok, err, SchemaVersion)
	}
}

// Inboxes sharing a schema migrate at once (they used to take turns on a
// schema-wide lock for the whole DDL), including into a schema none of
// them found.
func TestMigrateOfManyInboxesInOneNewSchema(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		s, err := New(pool, config.Sink{Schema: "shared", InboxTable: fmt.Sprintf("inbox_%d", i), Layout: config.LayoutTable})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { errs <- s.Migrate(ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent migrate of inboxes in one schema: %v", err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'shared'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if want := 8 * len(NamesFor(config.Sink{InboxTable: "x"}).Provisioned(Options{})); n != want {
		t.Fatalf("%d tables in schema shared, want %d", n, want)
	}
}

// A role a DBA grants USAGE and CREATE on an existing schema, and nothing on
// the database, migrates: the schema is not created again.
func TestMigrateUnderASchemaOnlyRole(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	role := "idc_schema_only_" + strings.ReplaceAll(randomName(), "-", "_")
	pgtest.Exec(t, pool, "CREATE SCHEMA app",
		"CREATE ROLE "+role+" LOGIN",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT USAGE, CREATE ON SCHEMA app TO "+role)
	t.Cleanup(func() {
		pgtest.Exec(t, pool, "DROP OWNED BY "+role)
		admin, err := pgx.Connect(context.Background(), pgtest.AdminDSN())
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close(context.Background())
		pool.Close()
		if _, err := admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role); err != nil {
			t.Logf("dropping %s: %v", role, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	rolePool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rolePool.Close)
	s, err := New(rolePool, config.Sink{Schema: "app", InboxTable: "inbox_orders", Layout: config.LayoutTable})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate as a role with USAGE and CREATE on the schema only: %v", err)
	}
	if v, err := s.SchemaVersion(ctx); err != nil || v != SchemaVersion {
		t.Fatalf("SchemaVersion = %d, %v", v, err)
	}
}

func randomName() string { return fmt.Sprintf("%08x", rand.Uint32()) }
