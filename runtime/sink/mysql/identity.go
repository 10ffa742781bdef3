package mysql

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// Check reads the inbox's identity and version for the controller without
// a lock or a change (runtime/inbox Store.Check's semantics): a lost inbox
// or another owner's is refused at once (LostError, OwnedError); ready is
// true when it is at this schema version in this layout, holds c.Epoch
// intact and records exactly c.Owner, so MigrateFor(c) would do nothing.
func (s *Inbox) Check(ctx context.Context, c inbox.OwnerClaim) (id inbox.Identity, version int, ready bool, err error) {
	defer s.advise(&err)
	st, err := s.readState(ctx, s.d.db)
	if err != nil {
		return id, 0, false, err
	}
	if err := st.Refusal(s.name(), s.opts.Epoch, &c); err != nil {
		return id, st.Version, false, err
	}
	id.Owner, id.Epoch = st.Owner, st.Epoch
	upToDate := st.HasInbox && st.Version == inbox.SchemaVersion && st.Layout == string(s.layout)
	return id, st.Version, upToDate && st.IdentityDone(&c), nil
}

// MarkRestored marks the inbox of epoch lost in its own meta row (found
// older than the resource's record of it): every runtime's Verify then
// fails, and MigrateFor refuses, until a person accepts the loss.
func (s *Inbox) MarkRestored(ctx context.Context, epoch string) (err error) {
	defer s.advise(&err)
	if _, err := s.d.db.ExecContext(ctx, `UPDATE `+s.meta+` SET epoch = ? WHERE epoch = ?`,
		inbox.RestoredEpoch(epoch), epoch); err != nil {
		return fmt.Errorf("while marking inbox %s restored: %w", s.name(), err)
	}
	return nil
}

// DropOwned drops the inbox only when its meta row records owner (cluster,
// namespace, name and UID); an inbox another resource owns, or one that
// records no owner, is refused with inbox.ErrNotOwner. The owner is read
// again under the DDL lock before anything is dropped.
func (s *Inbox) DropOwned(ctx context.Context, owner inbox.Owner) (err error) {
	defer s.advise(&err)
	st, err := s.readState(ctx, s.d.db)
	if err != nil {
		return fmt.Errorf("while dropping inbox %s: %w", s.name(), err)
	}
	if !st.HasMeta && !st.HasInbox {
		return nil
	}
	if st.Owner != owner {
		if st.Owner.IsZero() {
			return fmt.Errorf("while dropping inbox %s: %w: it records no owner", s.name(), inbox.ErrNotOwner)
		}
		return fmt.Errorf("while dropping inbox %s: %w: it belongs to %s", s.name(), inbox.ErrNotOwner, st.Owner)
	}
	return s.drop(ctx, &owner)
}

// Stats are the inbox gauges, cheap on a big table: the row count is
// InnoDB's estimate (information_schema.TABLES, summed over partitions,
// the epoch marker row included), the oldest row one probe of the
// processed_at index (per partition when Partitioned) below the marker's
// year.
func (s *Inbox) Stats(ctx context.Context) (st inbox.Stats, err error) {
	defer s.advise(&err)
	var micros *int64
	err = s.d.db.QueryRowContext(ctx, `SELECT
		(SELECT COALESCE(MAX(table_rows), 0) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?),
		(SELECT TIMESTAMPDIFF(MICROSECOND, MIN(processed_at), UTC_TIMESTAMP(6)) FROM `+s.inbox+` WHERE processed_at < ?)`,
		s.names.Schema, s.names.Inbox, markerYear).Scan(&st.Rows, &micros)
	if err != nil {
		return st, fmt.Errorf("while reading inbox stats: %w", err)
	}
	if micros != nil && *micros > 0 {
		st.OldestAge = time.Duration(*micros) * time.Microsecond
	}
	return st, nil
}

// markerYear is below the epoch marker's processed_at: every real row is.
const markerYear = "9999-01-01 00:00:00"

// advise adds the GRANT to run to a privilege error (see Advice).
func (s *Inbox) advise(err *error) {
	if *err != nil {
		*err = s.d.WithAdvice(*err, s.names.Schema)
	}
}

// userHost splits CURRENT_USER()'s "user@host".
func userHost(account string) (user, host string) {
	i := strings.LastIndexByte(account, '@')
	if i < 0 {
		return account, "%"
	}
	return account[:i], account[i+1:]
}
