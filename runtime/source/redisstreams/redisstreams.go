// Package redisstreams is the Redis Streams adapter: a consumer group read
// with XREADGROUP, entries left pending too long taken over with XAUTOCLAIM
// (the lease), acknowledged with XACK.
package redisstreams

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// Source reads one stream through a consumer group.
type Source struct {
	log      logr.Logger
	rdb      *redis.Client
	stream   string
	group    string
	consumer string
	body     string
	minIdle  time.Duration
	// claimCursor is where the next XAUTOCLAIM scan of the group's pending
	// entries starts.
	claimCursor string
	// claimAfter pauses XAUTOCLAIM after a full scan of the group's pending
	// entries found nothing to claim.
	claimAfter time.Time
	// ownCursor is where the next read of this consumer's own pending
	// entries starts; empty once they have all been read again.
	ownCursor string
}

var _ source.Source = (*Source)(nil)

// Option customises New.
type Option func(*options)

type options struct {
	consumer string
}

// WithConsumerName sets the consumer name within the group (default: the
// host name).
func WithConsumerName(name string) Option {
	return func(o *options) { o.consumer = name }
}

// New connects to Redis and creates the consumer group (and the stream) if
// missing. A new group starts at the beginning of the stream.
func New(ctx context.Context, cfg *config.RedisStreams, logger logr.Logger, opts ...Option) (*Source, error) {
	o, err := resolveOptions(opts)
	if err != nil {
		return nil, err
	}
	ropts, err := brokerconn.RedisOptions(cfg.Address, cfg.PasswordEnv, cfg.TLS, nil, brokerconn.Redis{})
	if err != nil {
		return nil, err
	}
	s := &Source{
		log:         logger.WithValues("stream", cfg.Stream, "group", cfg.Group, "consumer", o.consumer),
		rdb:         redis.NewClient(ropts),
		stream:      cfg.Stream,
		group:       cfg.Group,
		consumer:    o.consumer,
		body:        cfg.BodyField,
		minIdle:     cfg.ClaimMinIdle.Duration,
		claimCursor: "0-0",
		ownCursor:   "0",
	}
	if s.body == "" {
		s.body = "body"
	}
	if s.minIdle <= 0 {
		s.minIdle = 30 * time.Second
	}
	if err := s.createGroup(ctx); err != nil {
		_ = s.rdb.Close()
		return nil, err
	}
	return s, nil
}

func resolveOptions(opts []Option) (options, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.consumer == "" {
		host, err := os.Hostname()
		if err != nil {
			return o, fmt.Errorf("while reading the host name for the consumer name: %w", err)
		}
		o.consumer = host
	}
	return o, nil
}

func (s *Source) createGroup(ctx context.Context) error {
	err := s.rdb.XGroupCreateMkStream(ctx, s.stream, s.group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("while creating consumer group %s on stream %s: %w", s.group, s.stream, err)
	}
	return nil
}

// groupError recreates the group when Redis lost it (NOGROUP, e.g. after a
// restart without persistence) and returns err; the next Fetch reads again.
func (s *Source) groupError(ctx context.Context, err error) error {
	if !strings.Contains(err.Error(), "NOGROUP") {
		return err
	}
	if cerr := s.createGroup(ctx); cerr != nil {
		return errors.Join(err, cerr)
	}
	s.log.Info("recreated the missing consumer group")
	return err
}

// Fetch returns, in this order: this consumer's own pending entries (once,
// after New), entries of any consumer pending longer than ClaimMinIdle, and
// only when there were none, new entries, waiting up to maxWait.
func (s *Source) Fetch(ctx context.Context, maxN int, maxWait time.Duration) ([]source.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if maxN <= 0 {
		return nil, nil
	}
	recovered, err := s.recover(ctx, maxN)
	if err != nil {
		return nil, err
	}
	if len(recovered) > 0 {
		return s.convert(ctx, recovered, true)
	}
	fresh, err := s.readNew(ctx, maxN, maxWait)
	if err != nil {
		return nil, err
	}
	return s.convert(ctx, fresh, false)
}

func (s *Source) recover(ctx context.Context, maxN int) ([]redis.XMessage, error) {
	own, err := s.readOwnPending(ctx, maxN)
	if err != nil || len(own) > 0 {
		return own, err
	}
	return s.claim(ctx, maxN)
}

// readOwnPending re-reads entries delivered to this consumer name before
// (by a previous process with the same name) and never acknowledged.
func (s *Source) readOwnPending(ctx context.Context, maxN int) ([]redis.XMessage, error) {
	if s.ownCursor == "" {
		return nil, nil
	}
	msgs, err := s.read(ctx, s.ownCursor, maxN, -1)
	if err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		s.ownCursor = ""
		return nil, nil
	}
	s.ownCursor = msgs[len(msgs)-1].ID
	return msgs, nil
}

// claim takes over entries pending longer than the lease. After a full scan
// that found nothing it rests for a quarter of the lease, so an idle group
// does not cost an XAUTOCLAIM per Fetch.
func (s *Source) claim(ctx context.Context, maxN int) ([]redis.XMessage, error) {
	if time.Now().Before(s.claimAfter) {
		return nil, nil
	}
	msgs, next, err := s.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: s.stream, Group: s.group, Consumer: s.consumer,
		MinIdle: s.minIdle, Start: s.claimCursor, Count: int64(maxN),
	}).Result()
	if err != nil {
		return nil, s.groupError(ctx, fmt.Errorf("while claiming idle pending entries with XAUTOCLAIM: %w", err))
	}
	s.claimCursor = next
	if next == "0-0" && len(msgs) == 0 {
		s.claimAfter = time.Now().Add(s.minIdle / 4)
	}
	if len(msgs) > 0 {
		s.log.V(1).Info("claimed idle pending entries", "count", len(msgs))
	}
	return msgs, nil
}

func (s *Source) readNew(ctx context.Context, maxN int, maxWait time.Duration) ([]redis.XMessage, error) {
	block := maxWait
	if block < time.Millisecond {
		block = -1 // no BLOCK argument: return at once
	}
	return s.read(ctx, ">", maxN, block)
}

func (s *Source) read(ctx context.Context, id string, maxN int, block time.Duration) ([]redis.XMessage, error) {
	res, err := s.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: s.group, Consumer: s.consumer, Streams: []string{s.stream, id},
		Count: int64(maxN), Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, s.groupError(ctx, fmt.Errorf("while reading stream %s with XREADGROUP: %w", s.stream, err))
	}
	var out []redis.XMessage
	for _, st := range res {
		out = append(out, st.Messages...)
	}
	return out, nil
}

// convert turns entries into messages. Entries deleted from the stream while
// pending come back without fields: they are acknowledged and dropped.
// Recovered entries get their delivery count from XPENDING.
func (s *Source) convert(ctx context.Context, entries []redis.XMessage, recovered bool) ([]source.Message, error) {
	attempts := map[string]int{}
	if recovered {
		attempts = s.attempts(ctx, entries)
	}
	msgs := make([]source.Message, 0, len(entries))
	var deleted []string
	for _, e := range entries {
		if len(e.Values) == 0 {
			deleted = append(deleted, e.ID)
			continue
		}
		m := s.message(e)
		m.Attempt = 1
		if recovered {
			m.Attempt = attempts[e.ID]
		}
		msgs = append(msgs, m)
	}
	if len(deleted) > 0 {
		s.log.Info("acknowledging pending entries deleted from the stream", "count", len(deleted))
		if err := s.xack(ctx, deleted); err != nil {
			return nil, err
		}
	}
	return msgs, nil
}

func (s *Source) message(e redis.XMessage) source.Message {
	m := source.Message{NativeID: e.ID, Headers: make(map[string]string, len(e.Values)), Ref: e.ID}
	for k, v := range e.Values {
		str := fmt.Sprint(v)
		if k == s.body {
			m.Body = []byte(str)
			continue
		}
		m.Headers[k] = str
	}
	if ms, err := strconv.ParseInt(strings.SplitN(e.ID, "-", 2)[0], 10, 64); err == nil {
		m.PublishedAt = time.UnixMilli(ms)
	}
	return m
}

// attempts reads the delivery counts of recovered entries; on error the
// counts stay unknown (0).
func (s *Source) attempts(ctx context.Context, entries []redis.XMessage) map[string]int {
	out := make(map[string]int, len(entries))
	pending, err := s.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: s.stream, Group: s.group, Consumer: s.consumer,
		Start: entries[0].ID, End: entries[len(entries)-1].ID, Count: int64(2 * len(entries)),
	}).Result()
	if err != nil {
		s.log.Error(err, "reading delivery counts with XPENDING failed")
		return out
	}
	for _, p := range pending {
		out[p.ID] = int(p.RetryCount)
	}
	return out
}

// Ack acknowledges the entries with one XACK, whose reply counts the
// entries it removed from the group's pending entries list: that reply is
// the broker's confirmation. Fewer than sent means the others were not
// pending. That is settled only when the group has delivered past them
// (they were acknowledged before: an earlier XACK whose reply was lost, or
// a consumer that claimed them); a group re-created or set back below them
// delivers them again, so the batch is not settled and Ack says so.
func (s *Source) Ack(ctx context.Context, msgs []source.Message) error {
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		id, ok := m.Ref.(string)
		if !ok {
			return fmt.Errorf("message %s was not fetched from Redis", m.NativeID)
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil
	}
	n, err := s.rdb.XAck(ctx, s.stream, s.group, ids...).Result()
	if err != nil {
		return fmt.Errorf("while acknowledging %d entries with XACK: %w", len(ids), err)
	}
	if int(n) == len(ids) {
		return nil
	}
	return s.acknowledgedBefore(ctx, ids, n)
}

// acknowledgedBefore checks, after XACK removed only n of ids, that the
// group's last-delivered-id is at or past every one of them.
func (s *Source) acknowledgedBefore(ctx context.Context, ids []string, n int64) error {
	groups, err := s.rdb.XInfoGroups(ctx, s.stream).Result()
	if err != nil {
		return fmt.Errorf("XACK acknowledged %d of %d entries, and reading the group's last-delivered-id failed: %w", n, len(ids), err)
	}
	for _, g := range groups {
		if g.Name != s.group {
			continue
		}
		for _, id := range ids {
			if compareIDs(id, g.LastDeliveredID) > 0 {
				return fmt.Errorf("XACK acknowledged %d of %d entries; entry %s is above the group's last-delivered-id %s, so the group (re-created or set back) delivers it again", n, len(ids), id, g.LastDeliveredID)
			}
		}
		return nil
	}
	return fmt.Errorf("XACK acknowledged %d of %d entries and group %s is gone from stream %s", n, len(ids), s.group, s.stream)
}

// compareIDs orders two entry IDs "ms-seq" (an unparsable one sorts last,
// so it never counts as delivered).
func compareIDs(a, b string) int {
	am, as, aok := splitID(a)
	bm, bs, bok := splitID(b)
	switch {
	case !aok:
		return 1
	case !bok:
		return -1
	case am != bm:
		return cmp.Compare(am, bm)
	}
	return cmp.Compare(as, bs)
}

func splitID(id string) (ms, seq uint64, ok bool) {
	m, q, _ := strings.Cut(id, "-")
	ms, err := strconv.ParseUint(m, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	if q != "" {
		if seq, err = strconv.ParseUint(q, 10, 64); err != nil {
			return 0, 0, false
		}
	}
	return ms, seq, true
}

func (s *Source) xack(ctx context.Context, ids []string) error {
	if err := s.rdb.XAck(ctx, s.stream, s.group, ids...).Err(); err != nil {
		return fmt.Errorf("while acknowledging %d entries with XACK: %w", len(ids), err)
	}
	return nil
}

// Close closes the client. Unacknowledged entries stay pending for this
// consumer name and are claimed by another consumer after ClaimMinIdle.
func (s *Source) Close() error {
	if err := s.rdb.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
		return fmt.Errorf("while closing the Redis client: %w", err)
	}
	return nil
}
