package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// OutboxShards is how many shards the outbox rows are spread over. One
// relay at a time owns a shard (a transaction advisory lock) and publishes
// its rows in id order; different shards are published in parallel.
const OutboxShards = 16

// OutboxRow is one outgoing event, written with the claim of its message.
type OutboxRow struct {
	// EventID is the stable derived id (the broker's dedup key).
	EventID  string
	SourceID string
	Shard    int
	Payload  []byte
	// Headers are the event's own headers (emit.headers), nil for none.
	Headers map[string]string
	// OrderKey is the entity key (empty without message.entity): events of
	// one key are published in id order, others may go in parallel.
	OrderKey string
}

// PendingEvent is an unsent outbox row claimed by the relay.
type PendingEvent struct {
	ID       int64
	EventID  string
	SourceID string
	Shard    int
	Payload  []byte
	Headers  map[string]string
	// OrderKey is the entity key, else the source message id.
	OrderKey  string
	CreatedAt time.Time
	// Attempts counts the failed publishes that count toward
	// delivery.maxAttempts (see Relay).
	Attempts int
}

// WriteOutbox inserts rows in tx (the claim transaction). An event id
// already present is kept as it is: the event was recorded before.
func (s *Store) WriteOutbox(ctx context.Context, tx pgx.Tx, rows []OutboxRow) error {
	if len(rows) == 0 {
		return nil
	}
	ids := make([]string, len(rows))
	srcs := make([]string, len(rows))
	shards := make([]int16, len(rows))
	payloads := make([][]byte, len(rows))
	headers := make([]*string, len(rows))
	keys := make([]*string, len(rows))
	for i, r := range rows {
		ids[i], srcs[i], shards[i], payloads[i] = r.EventID, r.SourceID, int16(r.Shard), r.Payload
		if len(r.Headers) > 0 {
			h, err := json.Marshal(r.Headers)
			if err != nil {
				return fmt.Errorf("while encoding the headers of outbox event %s: %w", r.EventID, err)
			}
			hs := string(h)
			headers[i] = &hs
		}
		if r.OrderKey != "" {
			keys[i] = &rows[i].OrderKey
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+s.outbox+` (event_id, source_id, shard, payload, headers, order_key)
		SELECT e, src, sh, p, h::jsonb, k FROM unnest($1::text[], $2::text[], $3::smallint[], $4::bytea[], $5::text[], $6::text[]) AS u(e, src, sh, p, h, k)
		ON CONFLICT (event_id) DO NOTHING`, ids, srcs, shards, payloads, headers, keys)
	if err != nil {
		return fmt.Errorf("while writing %d outbox rows: %w", len(rows), err)
	}
	return nil
}

// ClaimOutboxShard takes shard's relay lock in tx and locks up to limit of
// its unsent rows in id order (FOR UPDATE SKIP LOCKED). ok is false when
// another relay owns the shard right now.
func (s *Store) ClaimOutboxShard(ctx context.Context, tx pgx.Tx, shard, limit int) (events []PendingEvent, ok bool, err error) {
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1::int, $2::int)`, s.lockKey, 1000+shard).Scan(&ok); err != nil {
		return nil, false, fmt.Errorf("while taking the relay lock of outbox shard %d: %w", shard, err)
	}
	if !ok {
		return nil, false, nil
	}
	rows, err := tx.Query(ctx, `SELECT id, event_id, source_id, shard, payload, headers, COALESCE(order_key, source_id), created_at, attempts
		FROM `+s.outbox+` WHERE sent_at IS NULL AND shard = $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED`, shard, limit)
	if err != nil {
		return nil, true, fmt.Errorf("while claiming outbox shard %d: %w", shard, err)
	}
	events, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (PendingEvent, error) {
		var e PendingEvent
		return e, r.Scan(&e.ID, &e.EventID, &e.SourceID, &e.Shard, &e.Payload, &e.Headers, &e.OrderKey, &e.CreatedAt, &e.Attempts)
	})
	if err != nil {
		return nil, true, fmt.Errorf("while reading outbox shard %d: %w", shard, err)
	}
	return events, true, nil
}

// MarkOutboxSent marks rows sent in tx, the transaction that claimed them.
func (s *Store) MarkOutboxSent(ctx context.Context, tx pgx.Tx, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `UPDATE `+s.outbox+` SET sent_at = now() WHERE id = ANY($1)`, ids); err != nil {
		return fmt.Errorf("while marking %d outbox rows sent: %w", len(ids), err)
	}
	return nil
}

// NoteOutboxFailure records, in tx (the relay's claim transaction), that
// the events ids failed with reason; counted adds one to their attempts. It
// returns each event's attempts after the update.
func (s *Store) NoteOutboxFailure(ctx context.Context, tx pgx.Tx, ids []int64, reason string, counted bool) (map[int64]int, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	inc := 0
	if counted {
		inc = 1
	}
	rows, err := tx.Query(ctx, `UPDATE `+s.outbox+` SET attempts = attempts + $2, last_error = left($3, 1024)
		WHERE id = ANY($1) RETURNING id, attempts`, ids, inc, reason)
	if err != nil {
		return nil, fmt.Errorf("while recording the failure of %d outbox events: %w", len(ids), err)
	}
	out := make(map[int64]int, len(ids))
	var id int64
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		return nil, fmt.Errorf("while recording the failure of %d outbox events: %w", len(ids), err)
	}
	return out, nil
}

// OutboxStats is the outbox backlog.
type OutboxStats struct {
	Pending   int64
	OldestAge time.Duration
}

// OutboxStats counts unsent rows and the age of the oldest (database clock).
func (s *Store) OutboxStats(ctx context.Context) (OutboxStats, error) {
	var st OutboxStats
	var age float64
	err := s.pool.QueryRow(ctx, `SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
		FROM `+s.outbox+` WHERE sent_at IS NULL`).Scan(&st.Pending, &age)
	if err != nil {
		return st, fmt.Errorf("while reading outbox stats: %w", err)
	}
	st.OldestAge = time.Duration(age * float64(time.Second))
	return st, nil
}

// PruneOutbox deletes outbox rows sent before now()-window (database clock)
// in batches of batchSize, each its own short statement, until none are left
// or maxDuration has passed. Unsent rows are never deleted, however old. It
// returns the rows deleted.
func (s *Store) PruneOutbox(ctx context.Context, window time.Duration, batchSize int, maxDuration time.Duration) (int64, error) {
	if batchSize < 1 {
		return 0, fmt.Errorf("while pruning the outbox: batch size must be positive, got %d", batchSize)
	}
	exists, err := s.tableExists(ctx, s.outbox, "the outbox table")
	if err != nil || !exists {
		// An inbox that never used an outbox has none (schema version 6).
		return 0, err
	}
	stmt := `DELETE FROM ` + s.outbox + ` WHERE id = ANY(ARRAY(
		SELECT id FROM ` + s.outbox + ` WHERE sent_at < now() - make_interval(secs => $1) LIMIT $2 FOR UPDATE SKIP LOCKED))`
	var deleted int64
	for deadline := time.Now().Add(maxDuration); time.Now().Before(deadline); {
		tag, err := s.pool.Exec(ctx, stmt, window.Seconds(), batchSize)
		if err != nil {
			return deleted, fmt.Errorf("while deleting a batch of sent outbox rows: %w", err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() == 0 {
			break
		}
	}
	return deleted, nil
}

// RequeueOutbox puts a dead-lettered outbox event (native_id
// "outbox:<event id>") back in the outbox, unsent and with no attempts, in
// tx (the redrive's transaction, which also deletes the dead letter). Its
// shard is the one of its source id: the order key is not kept with the
// dead letter, and its key's later events went ahead of it anyway.
func (s *Store) RequeueOutbox(ctx context.Context, tx pgx.Tx, d StoredDeadLetter) error {
	eventID := strings.TrimPrefix(d.NativeID, OutboxNativeIDPrefix)
	var headers *string
	if len(d.Headers) > 0 {
		h, err := json.Marshal(d.Headers)
		if err != nil {
			return fmt.Errorf("while encoding the headers of outbox event %s: %w", eventID, err)
		}
		hs := string(h)
		headers = &hs
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+s.outbox+` (event_id, source_id, shard, payload, headers)
		VALUES ($1, $2, $3, $4, $5::jsonb)
		ON CONFLICT (event_id) DO UPDATE SET sent_at = NULL, attempts = 0, last_error = NULL`,
		eventID, d.MessageID, OutboxShard(d.MessageID), d.Payload, headers)
	if err != nil {
		return fmt.Errorf("while requeueing outbox event %s: %w", eventID, err)
	}
	return nil
}

// OutboxShard is FNV-1a of key modulo OutboxShards.
func OutboxShard(key string) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % OutboxShards)
}

// OutboxRejectedClass is the dead-letter reason class of an event the emit
// target refused for good (too large for the broker).
const OutboxRejectedClass = "outbox_rejected"

// DeadLetterClasses are the reason_class values of the dead-letter table
// (the consumer's reason classes and the relay's); redrive's --reason and
// the redrive-reason annotation accept exactly these.
var DeadLetterClasses = []string{"missing_id", "invalid_id", "invalid_json", "evaluation", "database", "http", "id_conflict", OutboxRejectedClass}

// OutboxNativeIDPrefix starts the native_id of a dead-lettered outbox
// event ("outbox:<event id>"): redrive puts such a row back in the outbox
// instead of through the claim, whose id is already in the inbox.
const OutboxNativeIDPrefix = "outbox:"

// DeadLetterOutbox moves a claimed event the target refused for good from
// the outbox to the dead letters, in tx (the relay's claim transaction):
// message_id is the source message, native_id "outbox:<event id>", the
// payload the event's. The effect of the source message stays committed.
func (s *Store) DeadLetterOutbox(ctx context.Context, tx pgx.Tx, e PendingEvent, reason, class string) error {
	if _, err := s.DeadLetter(ctx, tx, []DeadLetter{{MessageID: e.SourceID, NativeID: OutboxNativeIDPrefix + e.EventID,
		Reason: "outbox: " + reason, Class: class, Payload: e.Payload, Headers: e.Headers, Attempts: max(e.Attempts, 1)}}); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+s.outbox+` WHERE id = $1`, e.ID); err != nil {
		return fmt.Errorf("while removing rejected outbox event %s: %w", e.EventID, err)
	}
	return nil
}
