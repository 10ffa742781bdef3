package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// Claim is one message id to record as processed.
type Claim struct {
	MessageID   string
	PublishedAt time.Time
	// Fingerprint of the payload (see Fingerprint); a duplicate whose
	// fingerprint differs is an id conflict (Conflicts).
	Fingerprint int64
}

// Claim records the ids in the inbox inside tx and returns the ids that were
// new: only those get the effect. Ids repeated in the batch are claimed once.
//
// Table layout: one INSERT … ON CONFLICT DO NOTHING; a concurrent replica
// claiming the same id waits on the primary key and then skips it.
//
// Partitioned layout: the primary key is (message_id, published_on), so the
// key alone cannot refuse an id re-published on another day. The insert also
// checks every live partition (NOT EXISTS), and before it the batch takes a
// transaction advisory lock per id, in a fixed order so two batches cannot
// deadlock. Because the claim statement starts after the locks are held, its
// READ COMMITTED snapshot sees any claim committed by the lock's previous
// holder, which closes the race where two replicas insert the same id into
// two different partitions. The caller must use READ COMMITTED (the
// consumer does); under REPEATABLE READ the snapshot predates the locks.
// Ids whose partition was already pruned are, by design, outside retention.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, claims []Claim) (map[string]struct{}, error) {
	ids, days, fps := dedupeClaims(claims)
	if len(ids) == 0 {
		return map[string]struct{}{}, nil
	}
	var rows pgx.Rows
	var err error
	if s.layout == config.LayoutPartitioned {
		rows, err = s.claimPartitioned(ctx, tx, ids, days, fps)
	} else {
		rows, err = tx.Query(ctx, `INSERT INTO `+s.inbox+` (message_id, fingerprint)
			SELECT id, NULLIF(fp, 0) FROM unnest($1::text[], $2::int8[]) AS u(id, fp)
			ON CONFLICT DO NOTHING RETURNING message_id`, ids, fps)
	}
	if err != nil {
		return nil, fmt.Errorf("while claiming %d ids in the inbox: %w", len(ids), err)
	}
	return collectSet(rows, "while claiming ids in the inbox")
}

func (s *Store) claimPartitioned(ctx context.Context, tx pgx.Tx, ids []string, days []time.Time, fps []int64) (pgx.Rows, error) {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int, k)
		FROM (SELECT DISTINCT hashtext(id) AS k FROM unnest($2::text[]) AS u(id) ORDER BY 1) AS keys`,
		s.lockKey+1, ids)
	if err != nil {
		return nil, fmt.Errorf("while locking the claimed ids: %w", err)
	}
	dates := make([]pgtype.Date, len(days))
	for i, d := range days {
		dates[i] = pgtype.Date{Time: d, Valid: true}
	}
	return tx.Query(ctx, `INSERT INTO `+s.inbox+` (message_id, published_on, fingerprint)
		SELECT u.id, u.day, NULLIF(u.fp, 0) FROM unnest($1::text[], $2::date[], $3::int8[]) AS u(id, day, fp)
		WHERE NOT EXISTS (SELECT 1 FROM `+s.inbox+` AS i WHERE i.message_id = u.id)
		ON CONFLICT DO NOTHING RETURNING message_id`, ids, dates, fps)
}

// dedupeClaims drops in-batch duplicates and sorts by id (byte order, which
// is a new inbox's key order: its message_id is COLLATE "C"): every claim then
// inserts its ids in the same order, so two replicas claiming overlapping
// batches wait on each other instead of deadlocking (ON CONFLICT DO NOTHING
// still waits for another transaction's uncommitted insert of the same id).
func dedupeClaims(claims []Claim) ([]string, []time.Time, []int64) {
	// Sorting indexes (stable: a repeated id keeps its first claim) moves
	// ints instead of whole claims.
	order := make([]int32, len(claims))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return strings.Compare(claims[a].MessageID, claims[b].MessageID) })
	ids := make([]string, 0, len(claims))
	days := make([]time.Time, 0, len(claims))
	fps := make([]int64, 0, len(claims))
	for k, i := range order {
		c := &claims[i]
		if k > 0 && c.MessageID == claims[order[k-1]].MessageID {
			continue
		}
		ids = append(ids, c.MessageID)
		days = append(days, Day(c.PublishedAt))
		fps = append(fps, c.Fingerprint)
	}
	return ids, days, fps
}

func collectSet(rows pgx.Rows, doing string) (map[string]struct{}, error) {
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", doing, err)
	}
	set := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		set[id] = struct{}{}
	}
	return set, nil
}

// Unclaim removes ids claimed earlier in the same transaction whose effect
// could not be evaluated: they are dead-lettered instead, and a corrected
// re-publish under the same id must not be skipped as a duplicate.
func (s *Store) Unclaim(ctx context.Context, tx pgx.Tx, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+s.inbox+` WHERE message_id = ANY($1::text[])`, ids); err != nil {
		return fmt.Errorf("while releasing %d claimed ids: %w", len(ids), err)
	}
	return nil
}

// Existing returns which of ids are already in the inbox. The http effect
// uses it before calling out, since its inbox rows are written afterwards.
func (s *Store) Existing(ctx context.Context, q Querier, ids []string) (map[string]struct{}, error) {
	if len(ids) == 0 {
		return map[string]struct{}{}, nil
	}
	rows, err := q.Query(ctx, `SELECT DISTINCT message_id FROM `+s.inbox+` WHERE message_id = ANY($1::text[])`, ids)
	if err != nil {
		return nil, fmt.Errorf("while looking up %d ids in the inbox: %w", len(ids), err)
	}
	return collectSet(rows, "while looking up ids in the inbox")
}

// DeadLetter is one message that cannot be processed.
type DeadLetter struct {
	// MessageID is empty when the id itself could not be extracted.
	MessageID string
	NativeID  string
	Reason    string
	// Class is the bounded reason class (the idc_dead_letters_total label).
	Class       string
	Payload     []byte
	Headers     map[string]string
	Attempts    int
	PublishedAt time.Time
}

// DeadLetter inserts the rows inside tx in one statement and reports which
// were new. A message already dead-lettered under the same broker native id
// (a redelivered poison message) is not inserted twice.
func (s *Store) DeadLetter(ctx context.Context, tx pgx.Tx, dls []DeadLetter) ([]bool, error) {
	if len(dls) == 0 {
		return nil, nil
	}
	n := len(dls)
	ids, natives, reasons, headers, classes := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	payloads, attempts := make([][]byte, n), make([]int32, n)
	published := make([]pgtype.Timestamptz, n)
	for i, d := range dls {
		ids[i], natives[i], reasons[i], classes[i] = cleanText(d.MessageID), cleanText(d.NativeID), cleanText(d.Reason), cleanText(d.Class)
		payloads[i], attempts[i] = d.Payload, int32(d.Attempts)
		h, err := json.Marshal(cleanHeaders(d.Headers))
		if err != nil {
			return nil, fmt.Errorf("while encoding dead-letter headers: %w", err)
		}
		headers[i] = string(h)
		published[i] = pgtype.Timestamptz{Time: d.PublishedAt, Valid: !d.PublishedAt.IsZero()}
	}
	rows, err := tx.Query(ctx, `INSERT INTO `+s.deadLetters+`
		(message_id, native_id, reason, payload, headers, attempts, published_at, reason_class)
		SELECT NULLIF(u.id, ''), NULLIF(u.native, ''), u.reason, u.payload, u.headers::jsonb, u.attempts, u.published, NULLIF(u.class, '')
		FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::text[], $6::int[], $7::timestamptz[], $8::text[])
			AS u(id, native, reason, payload, headers, attempts, published, class)
		ON CONFLICT (native_id) DO NOTHING
		RETURNING coalesce(native_id, '')`,
		ids, natives, reasons, payloads, headers, attempts, published, classes)
	if err != nil {
		return nil, fmt.Errorf("while inserting %d dead letters: %w", n, err)
	}
	returned, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("while inserting %d dead letters: %w", n, err)
	}
	return insertedRows(natives, returned), nil
}

// insertedRows maps the native ids RETURNING gave back onto the input rows:
// a row without a native id never conflicts; of several rows sharing one,
// only the first can have been inserted.
func insertedRows(natives, returned []string) []bool {
	fresh := map[string]bool{}
	for _, n := range returned {
		fresh[n] = true
	}
	out := make([]bool, len(natives))
	for i, n := range natives {
		if n == "" {
			out[i] = true
			continue
		}
		out[i] = fresh[n]
		delete(fresh, n)
	}
	return out
}

// cleanText makes s storable in a text column: PostgreSQL rejects NUL bytes
// and invalid UTF-8, and a dead letter that cannot be written would stall the
// consumer on the very message it is meant to set aside.
func cleanText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
}

func cleanHeaders(h map[string]string) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		out[cleanText(k)] = cleanText(v)
	}
	return out
}
