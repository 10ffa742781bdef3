package mysql

// Existing and the id conflicts on MySQL/MariaDB (the semantics of
// runtime/inbox/claim.go's Existing and runtime/inbox/conflicts.go).

import (
	"context"
	"fmt"
	"strings"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// inIDs is "?, ?, …" and the ids as VARBINARY arguments.
func inIDs(ids []string) (string, []any) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = idArg(id)
	}
	return strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", "), args
}

// Existing returns which of ids are claimed (outside a transaction).
func (s *Inbox) Existing(ctx context.Context, ids []string) (map[string]struct{}, error) {
	out := map[string]struct{}{}
	if len(ids) == 0 {
		return out, nil
	}
	in, args := inIDs(ids)
	rows, err := s.d.db.QueryContext(ctx, `SELECT message_id FROM `+s.inbox+` WHERE message_id IN (`+in+`)`, args...)
	if err != nil {
		return nil, fmt.Errorf("while looking up %d ids in the inbox: %w", len(ids), err)
	}
	if err := collect(rows, out); err != nil {
		return nil, fmt.Errorf("while looking up ids in the inbox: %w", err)
	}
	return out, nil
}

// Conflicts returns the claims that were not fresh and whose fingerprint
// differs from the one stored with their id, read in tx after the claim.
// Claims without a fingerprint, and ids stored without one, never conflict.
func (s *Inbox) Conflicts(ctx context.Context, tx sink.Tx, claims []inbox.Claim, fresh map[string]struct{}) ([]inbox.Conflict, error) {
	t, err := sqlTx(tx)
	if err != nil {
		return nil, err
	}
	var dupIDs []string
	for _, c := range claims {
		if _, ok := fresh[c.MessageID]; !ok && c.Fingerprint != 0 {
			dupIDs = append(dupIDs, c.MessageID)
		}
	}
	if len(dupIDs) == 0 {
		return nil, nil
	}
	in, args := inIDs(dupIDs)
	rows, err := t.QueryContext(ctx, `SELECT message_id, fingerprint FROM `+s.inbox+`
		WHERE message_id IN (`+in+`) AND fingerprint IS NOT NULL`, args...)
	if err != nil {
		return nil, fmt.Errorf("while reading the fingerprints of %d duplicate ids: %w", len(dupIDs), err)
	}
	defer func() { _ = rows.Close() }()
	stored := map[string]int64{}
	for rows.Next() {
		var id []byte
		var fp int64
		if err := rows.Scan(&id, &fp); err != nil {
			return nil, fmt.Errorf("while reading duplicate fingerprints: %w", err)
		}
		stored[string(id)] = fp
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("while reading duplicate fingerprints: %w", err)
	}
	var out []inbox.Conflict
	for i, c := range claims {
		if _, ok := fresh[c.MessageID]; ok || c.Fingerprint == 0 {
			continue
		}
		if fp, ok := stored[c.MessageID]; ok && fp != c.Fingerprint {
			out = append(out, inbox.Conflict{Index: i, MessageID: c.MessageID, Claimed: fp, Conflicted: c.Fingerprint})
		}
	}
	return out, nil
}

// RecordConflicts inserts rows into <inbox>_id_conflicts in tx, one
// statement.
func (s *Inbox) RecordConflicts(ctx context.Context, tx sink.Tx, cs []inbox.ConflictRecord) error {
	if len(cs) == 0 {
		return nil
	}
	t, err := sqlTx(tx)
	if err != nil {
		return err
	}
	args := make([]any, 0, 5*len(cs))
	for _, c := range cs {
		args = append(args, []byte(inbox.CleanText(c.MessageID)), nullBytes(inbox.CleanText(c.NativeID)), c.Claimed, c.Conflicted, c.Payload)
	}
	if _, err := t.ExecContext(ctx, `INSERT INTO `+s.idConflicts+` (message_id, native_id, claimed_fingerprint, conflict_fingerprint, payload)
		VALUES `+placeholders(len(cs), 5), args...); err != nil {
		return fmt.Errorf("while recording %d id conflicts: %w", len(cs), err)
	}
	return nil
}

// ConflictCount is the number of id conflicts kept: rows of
// <inbox>_id_conflicts plus dead letters set aside as id conflicts.
func (s *Inbox) ConflictCount(ctx context.Context) (int64, error) {
	var n int64
	if err := s.d.db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM `+s.idConflicts+`)
		+ (SELECT COUNT(*) FROM `+s.deadLetters+` WHERE reason COLLATE utf8mb4_bin LIKE 'id conflict: %')`).Scan(&n); err != nil {
		return 0, fmt.Errorf("while counting id conflicts: %w", err)
	}
	return n, nil
}
