package retention

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

type redisInspector struct {
	cfg    *config.RedisStreams
	getenv Getenv
	dial   brokerconn.Dialer
}

// redisSession is one go-redis client; its commands run one after the
// other, so they share one pooled connection.
type redisSession struct {
	*redisInspector
	rdb *redis.Client
}

// open builds the client; nothing is dialled until the first command.
func (r *redisInspector) open(context.Context) (session, error) {
	opts, err := brokerconn.RedisOptions(r.cfg.Address, r.cfg.PasswordEnv, r.cfg.TLS, r.getenv,
		brokerconn.Redis{DialTimeout: 5 * time.Second, MaxRetries: 1, DialerRetries: 2, Dial: r.dial})
	if err != nil {
		return nil, err
	}
	return &redisSession{redisInspector: r, rdb: redis.NewClient(opts)}, nil
}

func (r *redisSession) close() { _ = r.rdb.Close() }

// inspect observes the stream with XINFO STREAM. Nothing Redis reports
// bounds the horizons: entries stay until a producer trims them (MAXLEN or
// MINID, invisible to the broker's settings), and pending entries are taken
// over with XAUTOCLAIM after claimMinIdle without a limit on attempts. So
// L = A = R_replay = ∞ and a Redis source needs retention.maxReplayAge; the
// age of the oldest entry is reported for information only.
func (r *redisSession) inspect(ctx context.Context) (Observation, error) {
	info, err := r.rdb.XInfoStream(ctx, r.cfg.Stream).Result()
	var oldest string
	switch {
	case err != nil && strings.Contains(err.Error(), "no such key"):
		oldest = fmt.Sprintf("stream %s does not exist yet (XINFO STREAM; informational)", r.cfg.Stream)
	case err != nil && redisUnreachable(err):
		return Observation{}, unreachable("reading Redis stream "+r.cfg.Stream+" with XINFO STREAM", err)
	case err != nil:
		return Observation{}, fmt.Errorf("while reading Redis stream %s with XINFO STREAM: %w", r.cfg.Stream, err)
	default:
		oldest = r.describe(info)
	}
	return redisObservation(r.cfg, oldest), nil
}

// redisObservation: L = A = R_replay = ∞ (see Inspect); oldest is the
// informational description of the first entry.
func redisObservation(cfg *config.RedisStreams, oldest string) Observation {
	return Observation{
		Life:   Infinite(),
		Replay: Infinite(),
		Facts: []string{
			fmt.Sprintf("stream %s group %s (Redis Streams): entries stay until trimmed by producers, which the broker's settings do not show: L=∞, replay=∞", cfg.Stream, cfg.Group),
			fmt.Sprintf("pending entries are reclaimed with XAUTOCLAIM after claimMinIdle=%s without an attempts limit: A=∞", FormatDuration(cfg.ClaimMinIdle.Duration)),
		},
		Info: []string{oldest},
	}
}

// describe names the stream's first entry and when it was written. No
// length nor age: they change with every entry and every read, and this
// line goes into status.retention.derivedFrom, which must only change when
// the stream does (a trim moves the first entry).
func (r *redisInspector) describe(info *redis.XInfoStream) string {
	if info.Length == 0 || info.FirstEntry.ID == "" {
		return fmt.Sprintf("stream %s is empty (XINFO STREAM; informational)", r.cfg.Stream)
	}
	ms, _, _ := strings.Cut(info.FirstEntry.ID, "-")
	t, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return fmt.Sprintf("stream %s first entry %s (XINFO STREAM; informational)", r.cfg.Stream, info.FirstEntry.ID)
	}
	return fmt.Sprintf("stream %s first entry %s written %s (XINFO STREAM; informational)",
		r.cfg.Stream, info.FirstEntry.ID, time.UnixMilli(t).UTC().Format(time.RFC3339))
}

// redisUnreachable: the server could not be reached or dropped the
// connection; Redis error replies (auth, wrong type) are answers.
func redisUnreachable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) || errors.Is(err, redis.ErrClosed)
}
