package inbox

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
)

func TestFingerprintIsStableAndNeverZero(t *testing.T) {
	a, b := Fingerprint([]byte(`{"id":"a","n":1}`)), Fingerprint([]byte(`{"id":"a","n":2}`))
	if a == b || a == 0 || b == 0 {
		t.Fatalf("fingerprints %x and %x: want distinct and non-zero", a, b)
	}
	// The first 8 bytes of SHA-256("") = e3b0c44298fc1c14...
	if got := uint64(Fingerprint(nil)); got != 0xe3b0c44298fc1c14 {
		t.Fatalf("Fingerprint(empty) = %016x, want e3b0c44298fc1c14 (SHA-256, first 8 bytes)", got)
	}
}

func TestConflictsOnlyForADifferentPayload(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			s, pool := migrated(t, layout)
			ctx := context.Background()
			now := time.Now()
			claim(t, s, pool, Claim{MessageID: "a", PublishedAt: now, Fingerprint: 11}, Claim{MessageID: "old", PublishedAt: now})
			claims := []Claim{
				{MessageID: "a", PublishedAt: now, Fingerprint: 11},   // same payload
				{MessageID: "a", PublishedAt: now, Fingerprint: 22},   // a different event under a
				{MessageID: "old", PublishedAt: now, Fingerprint: 33}, // claimed without a fingerprint
				{MessageID: "new", PublishedAt: now, Fingerprint: 44},
			}
			var got []Conflict
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				fresh, err := s.Claim(ctx, tx, claims)
				if err != nil {
					return err
				}
				got, err = s.Conflicts(ctx, tx, claims, fresh)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != (Conflict{Index: 1, MessageID: "a", Claimed: 11, Conflicted: 22}) {
				t.Fatalf("conflicts = %+v, want only the second payload of a", got)
			}
		})
	}
}

// TestMigrateFromVersion1 builds an inbox as schema version 1 left it,
// with ids claimed, and migrates it twice while it is in use: the
// fingerprint column and the new tables appear, old ids keep no
// fingerprint (and so never conflict), and the version is 2.
func TestMigrateFromVersion1(t *testing.T) {
	for _, layout := range layouts {
		t.Run(string(layout), func(t *testing.T) {
			pool, _ := pgtest.NewPool(t)
			s := newStore(t, pool, layout)
			ctx := context.Background()
			v1 := []string{"CREATE SCHEMA idc",
				`CREATE TABLE idc.inbox_orders (message_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())`,
				`CREATE TABLE idc.inbox_orders_meta (singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton), schema_version int NOT NULL, layout text NOT NULL, migrated_at timestamptz NOT NULL DEFAULT now())`,
				`INSERT INTO idc.inbox_orders_meta (schema_version, layout) VALUES (1, 'Table')`,
				`INSERT INTO idc.inbox_orders (message_id) VALUES ('before-1'), ('before-2')`,
			}
			if layout != "Table" {
				v1[1] = `CREATE TABLE idc.inbox_orders (message_id text NOT NULL, published_on date NOT NULL, processed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (message_id, published_on)) PARTITION BY RANGE (published_on)`
				v1[3] = `INSERT INTO idc.inbox_orders_meta (schema_version, layout) VALUES (1, 'Partitioned')`
				v1[4] = `SELECT 1`
			}
			pgtest.Exec(t, pool, v1...)
			// A transaction of the old runtime holds rows while it migrates.
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, `SELECT count(*) FROM idc.inbox_orders`); err != nil {
				t.Fatal(err)
			}
			migrateCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Migrate(migrateCtx) }()
			_ = tx.Commit(ctx)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("second migrate: %v", err)
			}
			if v, err := s.SchemaVersion(ctx); err != nil || v != SchemaVersion {
				t.Fatalf("schema version %d, %v; want %d", v, err, SchemaVersion)
			}
			var nulls int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM idc.inbox_orders WHERE fingerprint IS NULL`).Scan(&nulls); err != nil {
				t.Fatal(err)
			}
			if layout == "Table" && nulls != 2 {
				t.Errorf("%d old ids without a fingerprint, want 2", nulls)
			}
			if n, err := s.ConflictCount(ctx); err != nil || n != 0 {
				t.Errorf("conflict count %d, %v; want the new table, empty", n, err)
			}
		})
	}
}
