package inbox

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/jackc/pgx/v5"
)

// Migrate creates the schema and every table of this inbox if missing and
// records the schema version. The optional tables (Options) are created
// when the store asks for them and upgraded when they exist. It is
// idempotent and safe to run from several replicas at once (they serialize
// on an advisory lock). It refuses an existing inbox of the other layout:
// the layout cannot change in place. A store that expects an epoch
// (WithExpectedEpoch: the runtime's config) never re-creates a lost inbox:
// it returns the *LostError instead.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := s.MigrateFor(ctx, nil)
	return err
}

// MigrateFor is Migrate for the controller's claim c: in the same locked
// transaction it refuses an inbox that is lost (unless c.AcceptLoss) or
// another resource's (unless c.AdoptFrom names it), records c's owner,
// and mints the epoch of a new inbox (or of one a person accepted). It
// returns the inbox's identity.
func (s *Store) MigrateFor(ctx context.Context, c *OwnerClaim) (Identity, error) {
	var id Identity
	if err := s.ensureSchema(ctx); err != nil {
		return id, fmt.Errorf("while migrating inbox %s: %w", s.inbox, err)
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		st, err := s.readState(ctx, tx)
		if err != nil {
			return err
		}
		// Before any DDL: a newer version's inbox is never written into.
		if err := s.CheckKnownVersion(st.version); err != nil {
			return err
		}
		if err := s.refusal(st, c); err != nil {
			return err
		}
		if err := s.migrateTables(ctx, tx, st); err != nil {
			return err
		}
		if st.fresh() || st.version == 0 {
			st = inboxState{hasMeta: true, hasInbox: true, layout: string(s.layout), version: SchemaVersion}
		}
		if !st.identityDone(c) {
			if st.epoch, err = s.writeIdentity(ctx, tx, st, c); err != nil {
				return err
			}
			if c != nil {
				st.owner = c.Owner
			}
		}
		id.Owner, id.Epoch = st.owner, st.epoch
		return nil
	})
	if err != nil {
		return id, fmt.Errorf("while migrating inbox %s: %w", s.inbox, err)
	}
	return id, nil
}

// migrateTables brings the tables of st to this version's shape.
func (s *Store) migrateTables(ctx context.Context, tx pgx.Tx, st inboxState) error {
	if st.version >= tablesUnchangedSince && st.version <= SchemaVersion && st.layout == string(s.layout) {
		// An inbox whose tables have their current shape runs no DDL on
		// them: ALTER TABLE takes an ACCESS EXCLUSIVE lock even when
		// there is nothing to add, which would stall (or deadlock with)
		// the replicas already consuming. Only an optional table it now
		// uses is created, the meta row given its owner and epoch columns
		// (a table no claim touches), and the version recorded.
		stmts := append(s.progressUpgradeDDL(), s.optionalDDL(st, false)...)
		if !st.hasInbox {
			// The inbox table is gone and a person accepted the loss
			// (MigrateFor refuses it otherwise): every table is created
			// again where missing.
			stmts = append(s.ddl(), stmts...)
		}
		if st.version < 7 {
			stmts = append(stmts, s.metaUpgradeDDL())
		}
		if err := execAll(ctx, tx, stmts); err != nil || st.version == SchemaVersion {
			return err
		}
		return s.recordVersion(ctx, tx)
	}
	if st.fresh() {
		// A new inbox: every table at its current shape and the version
		// recorded, in one round trip.
		stmts := append(s.ddl(), s.optionalDDL(st, false)...)
		return execAll(ctx, tx, append(stmts, s.metaDDL(), s.insertVersion()))
	}
	stmts := append(s.ddl(), s.upgradeDDL()...)
	stmts = append(stmts, s.progressUpgradeDDL()...)
	stmts = append(stmts, s.optionalDDL(st, true)...)
	if err := execAll(ctx, tx, append(stmts, s.metaDDL(), s.metaUpgradeDDL())); err != nil {
		return err
	}
	return s.recordVersion(ctx, tx)
}

// tablesUnchangedSince is the oldest schema version whose tables already
// have the current shape (6 only changed which optional tables exist), so
// upgrading from it runs no ALTER TABLE.
const tablesUnchangedSince = 5

// inboxState is what the catalog and the meta table say of an inbox.
type inboxState struct {
	version                int    // 0: not migrated
	layout                 string // as recorded
	hasInbox               bool   // the inbox table exists
	hasMeta                bool   // the meta table exists
	hasOutbox, hasRedrives bool
	// epoch and owner as the meta row records them (schema version 7).
	epoch string
	owner Owner
}

// fresh: nothing of the inbox exists yet (an inbox from before the meta
// table has its inbox table).
func (st inboxState) fresh() bool { return !st.hasMeta && !st.hasInbox }

// readState reads the recorded version and layout and which optional
// tables exist, in two queries at most.
func (s *Store) readState(ctx context.Context, q Querier) (inboxState, error) {
	var st inboxState
	err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL, to_regclass($3) IS NOT NULL, to_regclass($4) IS NOT NULL`,
		s.meta, s.inbox, s.outbox, s.redrives).Scan(&st.hasMeta, &st.hasInbox, &st.hasOutbox, &st.hasRedrives)
	if err != nil {
		return st, fmt.Errorf("while looking for the inbox tables: %w", err)
	}
	if !st.hasMeta {
		return st, nil
	}
	return st, s.readIdentity(ctx, q, &st)
}

// upToDate: at this version and layout, with every optional table the
// store uses.
func (s *Store) upToDate(st inboxState) bool {
	return st.version == SchemaVersion && st.layout == string(s.layout) &&
		(!s.opts.Outbox || st.hasOutbox) && (!s.opts.Redrives || st.hasRedrives)
}

// UpToDate reports the recorded schema version (0 when not migrated) and
// whether Migrate would have nothing to do: the question the controller
// asks on every pass, answered without a transaction or lock.
func (s *Store) UpToDate(ctx context.Context) (version int, upToDate bool, err error) {
	st, err := s.readState(ctx, s.pool)
	if err != nil {
		return 0, false, err
	}
	return st.version, s.upToDate(st), nil
}

// optionalDDL is the DDL of the optional tables the store uses and, when
// upgrading, of those that exist already (an older inbox has them all).
func (s *Store) optionalDDL(st inboxState, upgrading bool) []string {
	var stmts []string
	if s.opts.Outbox && !st.hasOutbox || upgrading && st.hasOutbox {
		stmts = append(stmts, s.outboxDDL()...)
	}
	if upgrading && st.hasOutbox {
		stmts = append(stmts, s.outboxUpgradeDDL()...)
	}
	if s.opts.Redrives && !st.hasRedrives || upgrading && st.hasRedrives {
		stmts = append(stmts, s.redrivesDDL()...)
	}
	return stmts
}

// ensureSchema creates the schema when it does not exist. An existing one
// is left alone, so a role with only USAGE and CREATE on a schema a DBA
// made (and no CREATE on the database) can migrate, and inboxes sharing a
// schema do not take turns: only the create itself, which is not safe
// against a concurrent one (unique violation on pg_namespace), runs under
// a schema-wide lock, in its own short transaction.
func (s *Store) ensureSchema(ctx context.Context) error {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, s.names.Schema).Scan(&exists); err != nil {
		return fmt.Errorf("while looking for schema %s: %w", s.names.Schema, err)
	}
	if exists {
		return nil
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1::int, 1)", schemaLockKey(s.names.Schema)); err != nil {
			return fmt.Errorf("while taking the schema DDL lock: %w", err)
		}
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident(s.names.Schema)); err != nil {
			return fmt.Errorf("while creating schema %s: %w", s.names.Schema, err)
		}
		return nil
	})
}

func schemaLockKey(schema string) int32 {
	return int32(crc32.ChecksumIEEE([]byte("schema:" + schema)))
}

func (s *Store) recordVersion(ctx context.Context, tx pgx.Tx) error {
	var layout string
	var version int
	err := tx.QueryRow(ctx, `SELECT layout, schema_version FROM `+s.meta).Scan(&layout, &version)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		_, err = tx.Exec(ctx, `INSERT INTO `+s.meta+` (schema_version, layout) VALUES ($1, $2)`,
			SchemaVersion, string(s.layout))
		if err != nil {
			return fmt.Errorf("while recording the schema version: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("while reading the schema version: %w", err)
	case layout != string(s.layout):
		return fmt.Errorf("inbox exists with layout %s, config asks for %s: the layout cannot change in place", layout, s.layout)
	case version > SchemaVersion:
		return fmt.Errorf("inbox schema version %d is newer than this runtime's %d", version, SchemaVersion)
	}
	_, err = tx.Exec(ctx, `UPDATE `+s.meta+` SET schema_version = $1, migrated_at = now()`, SchemaVersion)
	if err != nil {
		return fmt.Errorf("while recording the schema version: %w", err)
	}
	return nil
}

// tableExists reports whether the quoted, qualified table exists; what
// names it in the error.
func (s *Store) tableExists(ctx context.Context, table, what string) (bool, error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
		return false, fmt.Errorf("while looking for %s: %w", what, err)
	}
	return exists, nil
}

// SchemaVersion returns the version recorded by Migrate, or 0 when the inbox
// has not been migrated.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	exists, err := s.tableExists(ctx, s.meta, "the inbox meta table")
	if err != nil || !exists {
		return 0, err
	}
	var v int
	err = s.pool.QueryRow(ctx, `SELECT schema_version FROM `+s.meta).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("while reading the schema version: %w", err)
	}
	return v, nil
}

// Drop removes every table of this inbox (deletionPolicy: Delete). The
// schema is kept: it may hold the user's own tables. Idempotent. It refuses
// (ErrNotOperatorInbox) unless the inbox's meta table marks the tables as
// the operator's (ownInbox).
func (s *Store) Drop(ctx context.Context) error { return s.drop(ctx, nil) }

func (s *Store) drop(ctx context.Context, owner *Owner) error {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if own, err := s.ownInbox(ctx, tx, owner); err != nil || !own {
			return err
		}
		// Dropping the partitioned parent drops its partitions too.
		return execAll(ctx, tx, []string{
			"DROP TABLE IF EXISTS " + s.inbox,
			"DROP TABLE IF EXISTS " + s.deadLetters,
			"DROP TABLE IF EXISTS " + s.pruneRuns,
			"DROP TABLE IF EXISTS " + s.redrives,
			"DROP TABLE IF EXISTS " + s.idConflicts,
			"DROP TABLE IF EXISTS " + s.outbox,
			"DROP TABLE IF EXISTS " + s.progress,
			"DROP TABLE IF EXISTS " + s.window,
			"DROP TABLE IF EXISTS " + s.meta,
			"DROP FUNCTION IF EXISTS " + qualify(s.names.Schema, DerivedName(s.names.Inbox, "_truncated")) + "()",
		})
	})
	if err != nil {
		return fmt.Errorf("while dropping inbox %s: %w", s.inbox, err)
	}
	s.partitions.reset()
	return nil
}
