package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// ErrNotOperatorInbox is a Drop refused because the inbox's own meta table
// does not mark the tables as the operator's: a resource with deletionPolicy
// Delete must not drop tables it did not create (a user's table that happens
// to have the inbox's name, one created by hand, another tool's).
var ErrNotOperatorInbox = errors.New("the tables are not marked as an idc-operator inbox")

// metaColumns are the columns Migrate gives the meta table, and those it
// had before schema version 7.
var (
	metaColumns   = []string{"epoch", "layout", "migrated_at", "owner_cluster", "owner_name", "owner_namespace", "owner_uid", "schema_version", "singleton"}
	metaColumnsV6 = []string{"layout", "migrated_at", "schema_version", "singleton"}
)

// ownInbox says whether any table of this inbox exists, and fails with
// ErrNotOperatorInbox unless the meta table Migrate writes is there, has its
// columns, and holds its one row with a layout and a schema version this
// runtime knows. It runs in the drop transaction.
func (s *Store) ownInbox(ctx context.Context, tx pgx.Tx, owner *Owner) (bool, error) {
	tables := []string{s.inbox, s.deadLetters, s.pruneRuns, s.redrives, s.idConflicts, s.outbox, s.progress, s.window}
	var present []string
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(t), '{}') FROM unnest($1::text[]) t WHERE to_regclass(t) IS NOT NULL`, tables).Scan(&present); err != nil {
		return false, fmt.Errorf("while looking for the inbox tables: %w", err)
	}
	var metaOID *uint32
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1)::oid`, s.meta).Scan(&metaOID); err != nil {
		return false, fmt.Errorf("while looking for the inbox meta table: %w", err)
	}
	if metaOID == nil {
		if len(present) == 0 {
			return false, nil // nothing to drop
		}
		return false, fmt.Errorf("%w: %s exists but the inbox meta table %s does not", ErrNotOperatorInbox, present[0], s.meta)
	}
	var cols []string
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(attname::text ORDER BY attname), '{}') FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped`, *metaOID).Scan(&cols); err != nil {
		return false, fmt.Errorf("while reading the inbox meta table: %w", err)
	}
	if !slices.Equal(cols, metaColumns) && !slices.Equal(cols, metaColumnsV6) {
		return false, fmt.Errorf("%w: %s has columns %v, not the inbox meta table's %v", ErrNotOperatorInbox, s.meta, cols, metaColumns)
	}
	var rows, version int
	var layout string
	if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(max(layout), ''), coalesce(max(schema_version), 0) FROM `+s.meta).Scan(&rows, &layout, &version); err != nil {
		return false, fmt.Errorf("while reading the inbox meta table: %w", err)
	}
	known := layout == string(config.LayoutTable) || layout == string(config.LayoutPartitioned)
	if rows != 1 || !known || version < 1 || version > SchemaVersion {
		return false, fmt.Errorf("%w: %s holds %d rows (layout %q, schema version %d), not the one row Migrate records", ErrNotOperatorInbox, s.meta, rows, layout, version)
	}
	if owner != nil {
		// Read again under the drop's lock: a resource that adopted the
		// inbox since DropOwned read it owns it now.
		st := inboxState{hasMeta: true}
		if err := s.readIdentity(ctx, tx, &st); err != nil {
			return false, err
		}
		if st.owner != *owner {
			return false, fmt.Errorf("%w: it belongs to %s", ErrNotOwner, st.owner)
		}
	}
	return true, nil
}

// DropOwned is Drop for the controller: it drops the inbox only when its
// meta row records owner (the same cluster, namespace, name and UID), and
// refuses (ErrNotOwner) an inbox another resource owns or that records no
// owner, so deleting one resource never destroys another's dedup state.
func (s *Store) DropOwned(ctx context.Context, owner Owner) error {
	st, err := s.readState(ctx, s.pool)
	if err != nil {
		return fmt.Errorf("while dropping inbox %s: %w", s.inbox, err)
	}
	if !st.hasMeta && !st.hasInbox {
		return nil
	}
	if st.owner != owner {
		if st.owner.IsZero() {
			return fmt.Errorf("while dropping inbox %s: %w: it records no owner", s.inbox, ErrNotOwner)
		}
		return fmt.Errorf("while dropping inbox %s: %w: it belongs to %s", s.inbox, ErrNotOwner, st.owner)
	}
	return s.drop(ctx, &owner)
}
