package inbox

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// An inbox of schema version 5 has its tables' current shape: upgrading it
// runs no ALTER TABLE, so replicas writing the inbox (a row lock held here)
// do not wait on an ACCESS EXCLUSIVE lock when the operator is upgraded.
func TestUpgradeFromVersion5TouchesNoTable(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	s := newStore(t, pool, config.LayoutTable, WithOutbox(true), WithRedrives())
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+s.meta+` SET schema_version = 5`); err != nil {
		t.Fatal(err)
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	for _, table := range []string{s.inbox, s.outbox} {
		if _, err := holder.Exec(ctx, `LOCK TABLE `+table+` IN ROW EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
	}
	migrateCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := newStore(t, pool, config.LayoutTable).Migrate(migrateCtx); err != nil {
		t.Fatalf("upgrading a version-5 inbox while replicas write it: %v", err)
	}
	if v, err := s.SchemaVersion(ctx); err != nil || v != SchemaVersion {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, SchemaVersion)
	}
}

// An inbox of schema version 3 has an outbox without the columns version 4
// added: upgrading it with a store that does not ask for the outbox still
// upgrades the table it has, so a later emitting config finds it whole.
func TestUpgradeKeepsAndUpgradesTheOptionalTablesItHas(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.NewPool(t)
	s := newStore(t, pool, config.LayoutTable, WithOutbox(true), WithRedrives())
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Make it look like version 3: the outbox as 3 created it.
	for _, st := range []string{
		`ALTER TABLE ` + s.outbox + ` DROP COLUMN headers, DROP COLUMN order_key, DROP COLUMN attempts, DROP COLUMN last_error`,
		`UPDATE ` + s.meta + ` SET schema_version = 3`,
	} {
		if _, err := pool.Exec(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	if err := newStore(t, pool, config.LayoutTable).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var cols int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_schema = 'idc' AND table_name = $1
		AND column_name IN ('headers', 'order_key', 'attempts', 'last_error')`, s.Names().Outbox).Scan(&cols); err != nil {
		t.Fatal(err)
	}
	if cols != 4 {
		t.Fatalf("the upgraded outbox has %d of the 4 columns version 4 added", cols)
	}
	if got := schemaTables(t, pool); !slices.Contains(got, s.Names().Redrives) {
		t.Fatalf("the upgrade dropped the redrives log: %v", got)
	}
	if v, err := s.SchemaVersion(ctx); err != nil || v != SchemaVersion {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, SchemaVersion)
	}
}

// TestUpgradedInboxHasTheShapeOfANewOne: a new inbox gets every column in
// its CREATE TABLE, an old one gets the later columns from upgradeDDL. The
// two must agree, column by column, or the runtime's SQL would work on one
// and fail on the other.
func TestUpgradedInboxHasTheShapeOfANewOne(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			ctx := context.Background()
			pool, _ := pgtest.NewPool(t)
			opts := []Option{WithOutbox(true), WithRedrives()}
			fresh, err := New(pool, config.Sink{Schema: "fresh", InboxTable: "inbox_orders", Layout: layout}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := fresh.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			old := newStore(t, pool, layout, opts...)
			if err := old.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			// Make it look like version 3: without what upgradeDDL and
			// outboxUpgradeDDL add.
			pgtest.Exec(t, pool,
				`ALTER TABLE `+old.inbox+` DROP COLUMN fingerprint`,
				`ALTER TABLE `+old.deadLetters+` DROP COLUMN reason_class`,
				`ALTER TABLE `+old.pruneRuns+` DROP COLUMN window_cutoff, DROP COLUMN held_reason, DROP COLUMN held_since`,
				`ALTER TABLE `+old.outbox+` DROP COLUMN headers, DROP COLUMN order_key, DROP COLUMN attempts, DROP COLUMN last_error`,
				`UPDATE `+old.meta+` SET schema_version = 3`,
			)
			if err := old.Migrate(ctx); err != nil {
				t.Fatalf("upgrading from version 3: %v", err)
			}
			want, got := columnsOf(t, pool, "fresh"), columnsOf(t, pool, "idc")
			if len(want) == 0 {
				t.Fatal("no columns read for the new inbox")
			}
			if !slices.Equal(got, want) {
				t.Errorf("upgraded inbox columns differ from a new inbox's:\n got %v\nwant %v", got, want)
			}
		})
	}
}

// columnsOf lists schema's columns as table.column type nullability
// default, in a stable order.
func columnsOf(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
		FROM information_schema.columns WHERE table_schema = $1 ORDER BY table_name, column_name`, schema)
	if err != nil {
		t.Fatal(err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cols {
		// Sequence defaults name the schema: nextval('idc.x_id_seq').
		cols[i] = strings.ReplaceAll(c, "'"+schema+".", "'")
	}
	return cols
}

// A new inbox compares message ids byte by byte (COLLATE "C", as MySQL's
// VARBINARY does): an id is opaque, and the database's locale only made
// every index comparison dearer (BenchmarkClaimCollation). An inbox created
// before keeps its collation through Migrate (rebuilding the key of a live
// inbox would lock out its replicas) and claims as before.
func TestInboxIdsCompareByteByByte(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			ctx := context.Background()
			s, pool := migrated(t, layout)
			if got := idCollation(t, pool, s); got != "C" {
				t.Fatalf("message_id collation of a new inbox = %q, want C", got)
			}
			pgtest.Exec(t, pool, `ALTER TABLE `+s.inbox+` ALTER COLUMN message_id TYPE text COLLATE "default"`)
			if err := s.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if got := idCollation(t, pool, s); got != "default" {
				t.Fatalf("Migrate changed an existing inbox's message_id collation to %q", got)
			}
			if got := claim(t, s, pool, ids("b", "a", "B")...); len(got) != 3 {
				t.Fatalf("claimed %v, want 3 new ids", got)
			}
			if got := claim(t, s, pool, ids("a", "c")...); len(got) != 1 {
				t.Fatalf("claimed %v, want only c", got)
			}
		})
	}
}

func idCollation(t *testing.T, pool *pgxpool.Pool, s *Store) string {
	t.Helper()
	var coll string
	if err := pool.QueryRow(context.Background(), `SELECT c.collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
		WHERE a.attrelid = $1::regclass AND a.attname = 'message_id'`, s.inbox).Scan(&coll); err != nil {
		t.Fatal(err)
	}
	return coll
}
