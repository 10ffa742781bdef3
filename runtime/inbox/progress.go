package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ProgressRecord is one runtime process's row of <inbox>_progress. Every time
// is the database's clock.
type ProgressRecord struct {
	// Replica names the process: the pod name and a per-start suffix, so a
	// restarted container never overwrites what its predecessor left.
	Replica     string
	StartedAt   time.Time
	HeartbeatAt time.Time
	// LastCommitAt is the last claim transaction's commit; nil before one.
	LastCommitAt *time.Time
	// UnackedSince is when the oldest claim transaction that is committed
	// (or committing) but not yet acknowledged began; nil when none is.
	UnackedSince *time.Time
	// Positions are the highest broker positions claimed where the broker
	// has them: the stream sequence per JetStream stream, the offset per
	// Kafka "<topic>/<partition>". They tell an on-call engineer how far
	// a gone replica got; the hold itself never relies on them, because
	// claims made after the last heartbeat are not in them.
	Positions map[string]int64
	// Stopped: the process stopped gracefully after acknowledging every
	// claim it committed; it holds nothing back.
	Stopped bool
	// StaleSince is when a prune run found the replica no longer
	// heartbeating, and SettleMark where the broker's delivery stood then
	// (retention.Settlement.Position); nil until then.
	StaleSince *time.Time
	SettleMark map[string]int64
	// Consumer is the broker consumer the replica consumed from; nil in a
	// row written by a runtime older than schema version 7.
	Consumer *ConsumerIdentity
}

// ConsumerIdentity names the broker consumer a replica consumed from, so a
// prune run can tell whether the consumer it reads now is that one: a
// settlement read from a consumer created after the replica's claims proves
// nothing about them.
type ConsumerIdentity struct {
	// Kind is the source kind (config.Source.Kind()).
	Kind string `json:"kind"`
	// Name is the consumer: JetStream "<stream>/<durable>", Kafka the
	// group, RabbitMQ "<vhost>/<queue>" (vhost as configured), Redis
	// "<stream>/<group>".
	Name string `json:"name"`
	// Created is when the broker created the consumer, where it says
	// (JetStream); nil where it does not.
	Created *time.Time `json:"created,omitempty"`
}

// Same reports whether o names the same consumer as c (Created compared
// only when both have it).
func (c ConsumerIdentity) Same(o ConsumerIdentity) bool {
	if c.Kind != o.Kind || c.Name != o.Name {
		return false
	}
	return c.Created == nil || o.Created == nil || c.Created.Equal(*o.Created)
}

func (c ConsumerIdentity) String() string {
	if c.Created == nil {
		return c.Kind + " consumer " + c.Name
	}
	return c.Kind + " consumer " + c.Name + " created " + c.Created.UTC().Format(time.RFC3339Nano)
}

// Heartbeat is what a replica writes every few seconds. Ages are measured
// on the replica's clock and stored as now() - age on the database's, so
// the two clocks never need to agree.
type Heartbeat struct {
	Replica string
	// LastCommitAge is how long ago the last claim committed; nil before one.
	LastCommitAge *time.Duration
	// UnackedAge is how long ago the oldest claim not yet acknowledged
	// began; nil when every committed claim is acknowledged.
	UnackedAge *time.Duration
	Positions  map[string]int64
	Stopped    bool
	// Consumer is the broker consumer the replica consumes from (nil:
	// not known yet, the column keeps what was written before).
	Consumer *ConsumerIdentity
}

// WriteHeartbeat upserts the replica's progress row. Writing clears what a
// prune run noted while the replica looked gone: it is back.
func (s *Store) WriteHeartbeat(ctx context.Context, hb Heartbeat) error {
	positions, err := json.Marshal(orEmpty(hb.Positions))
	if err != nil {
		return fmt.Errorf("while encoding progress positions: %w", err)
	}
	var consumer []byte
	if hb.Consumer != nil {
		if consumer, err = json.Marshal(hb.Consumer); err != nil {
			return fmt.Errorf("while encoding the consumer identity: %w", err)
		}
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO `+s.progress+` AS p
		(replica, heartbeat_at, last_commit_at, unacked_since, positions, stopped, consumer)
		VALUES ($1, now(), now() - $2::bigint * interval '1 microsecond', now() - $3::bigint * interval '1 microsecond', $4, $5, $6)
		ON CONFLICT (replica) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at,
			last_commit_at = EXCLUDED.last_commit_at, unacked_since = EXCLUDED.unacked_since,
			positions = EXCLUDED.positions, stopped = EXCLUDED.stopped, stale_since = NULL, settle_mark = NULL,
			consumer = COALESCE(EXCLUDED.consumer, p.consumer)`,
		hb.Replica, micros(hb.LastCommitAge), micros(hb.UnackedAge), positions, hb.Stopped, consumer)
	if err != nil {
		return fmt.Errorf("while writing the progress of replica %s: %w", hb.Replica, err)
	}
	return nil
}

// micros is an age in microseconds for SQL; NULL (nil) stays NULL.
func micros(d *time.Duration) *int64 {
	if d == nil {
		return nil
	}
	v := max(d.Microseconds(), 0)
	return &v
}

func orEmpty(m map[string]int64) map[string]int64 {
	if m == nil {
		return map[string]int64{}
	}
	return m
}

// Progress returns the database's now() and every replica's progress row,
// oldest heartbeat first.
func (s *Store) Progress(ctx context.Context) (time.Time, []ProgressRecord, error) {
	var now time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return now, nil, fmt.Errorf("while reading the database clock: %w", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT replica, started_at, heartbeat_at, last_commit_at, unacked_since,
		positions, stopped, stale_since, settle_mark, consumer FROM `+s.progress+` ORDER BY heartbeat_at, replica`)
	if err != nil {
		return now, nil, fmt.Errorf("while reading the replicas' progress: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ProgressRecord, error) {
		var r ProgressRecord
		var positions, mark, consumer []byte
		if err := row.Scan(&r.Replica, &r.StartedAt, &r.HeartbeatAt, &r.LastCommitAt, &r.UnackedSince,
			&positions, &r.Stopped, &r.StaleSince, &mark, &consumer); err != nil {
			return r, err
		}
		if consumer != nil {
			r.Consumer = &ConsumerIdentity{}
			if err := json.Unmarshal(consumer, r.Consumer); err != nil {
				return r, fmt.Errorf("consumer of replica %s: %w", r.Replica, err)
			}
		}
		if err := json.Unmarshal(positions, &r.Positions); err != nil {
			return r, fmt.Errorf("positions of replica %s: %w", r.Replica, err)
		}
		if mark != nil {
			if err := json.Unmarshal(mark, &r.SettleMark); err != nil {
				return r, fmt.Errorf("settle mark of replica %s: %w", r.Replica, err)
			}
		}
		return r, nil
	})
	if err != nil {
		return now, nil, fmt.Errorf("while reading the replicas' progress: %w", err)
	}
	return now, recs, nil
}

// errProgressMoved: the row changed since it was read (the replica
// heartbeat again); the caller's decision about it no longer applies.
var errProgressMoved = errors.New("the replica wrote progress since it was read")

// MarkStale records that a prune run found the replica gone, and where the
// broker's delivery stood then: its claims have settled once the broker's
// floor passes that mark. It changes nothing when the replica heartbeat
// since rec was read.
func (s *Store) MarkStale(ctx context.Context, rec ProgressRecord, mark map[string]int64) error {
	encoded, err := json.Marshal(orEmpty(mark))
	if err != nil {
		return fmt.Errorf("while encoding the settle mark: %w", err)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE `+s.progress+` SET stale_since = now(), settle_mark = $3
		WHERE replica = $1 AND heartbeat_at = $2 AND stale_since IS NULL`, rec.Replica, rec.HeartbeatAt, encoded)
	if err != nil {
		return fmt.Errorf("while marking replica %s stale: %w", rec.Replica, err)
	}
	if tag.RowsAffected() == 0 {
		return errProgressMoved
	}
	return nil
}

// RetireProgress deletes a replica's row once it holds nothing back (it
// stopped gracefully, or the broker settled everything it could have
// claimed). A replica that heartbeat since rec was read keeps its row.
func (s *Store) RetireProgress(ctx context.Context, rec ProgressRecord) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM `+s.progress+` WHERE replica = $1 AND heartbeat_at = $2`,
		rec.Replica, rec.HeartbeatAt)
	if err != nil {
		return fmt.Errorf("while retiring the progress of replica %s: %w", rec.Replica, err)
	}
	return nil
}

// IsProgressMoved reports whether err says the replica wrote progress after
// the caller read it.
func IsProgressMoved(err error) bool { return errors.Is(err, errProgressMoved) }
