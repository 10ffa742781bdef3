package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Fingerprint is the first 8 bytes of SHA-256 of the payload's raw bytes,
// as a signed 64-bit integer (a bigint column). Two different events under
// one id collide with probability 2^-64; the same bytes always agree. It
// is never 0, which stands for "no fingerprint" (ids claimed before schema
// version 2).
func Fingerprint(payload []byte) int64 {
	sum := sha256.Sum256(payload)
	fp := int64(binary.BigEndian.Uint64(sum[:8]))
	if fp == 0 {
		return 1
	}
	return fp
}

// Conflict is a duplicate id whose payload differs from the claimed one: a
// producer reused the id for a different event.
type Conflict struct {
	// Index into the claims passed to Conflicts.
	Index               int
	MessageID           string
	Claimed, Conflicted int64
}

// Conflicts returns the claims that were not fresh and whose fingerprint
// differs from the one stored with their id. It reads inside tx after the
// claim, so it sees the claim of a concurrent replica the claim waited for.
// Claims without a fingerprint, and ids stored without one, never conflict.
func (s *Store) Conflicts(ctx context.Context, tx pgx.Tx, claims []Claim, fresh map[string]struct{}) ([]Conflict, error) {
	var dupIDs []string
	for _, c := range claims {
		if _, ok := fresh[c.MessageID]; !ok && c.Fingerprint != 0 {
			dupIDs = append(dupIDs, c.MessageID)
		}
	}
	if len(dupIDs) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, `SELECT message_id, fingerprint FROM `+s.inbox+`
		WHERE message_id = ANY($1::text[]) AND fingerprint IS NOT NULL`, dupIDs)
	if err != nil {
		return nil, fmt.Errorf("while reading the fingerprints of %d duplicate ids: %w", len(dupIDs), err)
	}
	stored := map[string]int64{}
	for rows.Next() {
		var id string
		var fp int64
		if err := rows.Scan(&id, &fp); err != nil {
			rows.Close()
			return nil, fmt.Errorf("while reading duplicate fingerprints: %w", err)
		}
		stored[id] = fp
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("while reading duplicate fingerprints: %w", err)
	}
	var out []Conflict
	for i, c := range claims {
		if _, ok := fresh[c.MessageID]; ok || c.Fingerprint == 0 {
			continue
		}
		if fp, ok := stored[c.MessageID]; ok && fp != c.Fingerprint {
			out = append(out, Conflict{Index: i, MessageID: c.MessageID, Claimed: fp, Conflicted: c.Fingerprint})
		}
	}
	return out, nil
}

// ConflictRecord is one row of <inbox>_id_conflicts.
type ConflictRecord struct {
	Conflict
	NativeID string
	Payload  []byte
}

// RecordConflicts inserts rows into <inbox>_id_conflicts inside tx.
func (s *Store) RecordConflicts(ctx context.Context, tx pgx.Tx, cs []ConflictRecord) error {
	if len(cs) == 0 {
		return nil
	}
	n := len(cs)
	ids, natives, claimed, conflicted, payloads := make([]string, n), make([]string, n), make([]int64, n), make([]int64, n), make([][]byte, n)
	for i, c := range cs {
		ids[i], natives[i], claimed[i], conflicted[i], payloads[i] = cleanText(c.MessageID), cleanText(c.NativeID), c.Claimed, c.Conflicted, c.Payload
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+s.idConflicts+` (message_id, native_id, claimed_fingerprint, conflict_fingerprint, payload)
		SELECT u.id, NULLIF(u.native, ''), u.claimed, u.conflicted, u.payload
		FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::bytea[]) AS u(id, native, claimed, conflicted, payload)`,
		ids, natives, claimed, conflicted, payloads)
	if err != nil {
		return fmt.Errorf("while recording %d id conflicts: %w", n, err)
	}
	return nil
}

// ConflictCount is the number of id conflicts kept: rows of
// <inbox>_id_conflicts (onPayloadMismatch Record) plus dead letters set
// aside as id conflicts (DeadLetter). Ignore keeps none.
func (s *Store) ConflictCount(ctx context.Context) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+s.idConflicts+`)
		+ (SELECT count(*) FROM `+s.deadLetters+` WHERE reason LIKE 'id conflict: %')`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("while counting id conflicts: %w", err)
	}
	return n, nil
}
