package retention

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// redisSeqBits is how many low bits of an encoded entry ID hold the
// sequence number; the millisecond part takes the rest.
const redisSeqBits = 20

// settle reads the group's last-delivered-id (XINFO GROUPS) and then its
// pending entries list (XPENDING summary). Position is the last-delivered-id:
// the group delivers in ID order, so nothing above it was handed out. The
// floor is the last-delivered-id when nothing is pending, else just below
// the lowest pending ID. Entries not yet delivered are not Unsettled: the
// consumer was never handed them. Reading XPENDING second keeps the pair
// safe: whatever was delivered up to Position and is no longer pending was
// acknowledged (or deleted).
func (r *redisSession) settle(ctx context.Context) (Settlement, error) {
	g, err := r.group(ctx)
	if err != nil {
		return Settlement{}, err
	}
	last := g.LastDeliveredID
	pel, err := r.rdb.XPending(ctx, r.cfg.Stream, r.cfg.Group).Result()
	switch {
	case err != nil && strings.HasPrefix(err.Error(), "NOGROUP"):
		return Settlement{}, fmt.Errorf("%w: group %s of Redis stream %s", ErrSourceNotFound, r.cfg.Group, r.cfg.Stream)
	case err != nil && redisUnreachable(err):
		return Settlement{}, unreachable("reading the pending entries of Redis stream "+r.cfg.Stream, err)
	case err != nil:
		return Settlement{}, fmt.Errorf("while reading the pending entries of group %s of Redis stream %s with XPENDING: %w", r.cfg.Group, r.cfg.Stream, err)
	}
	st, err := redisSettlement(r.cfg.Stream, r.cfg.Group, last, pel)
	if err != nil {
		return st, err
	}
	// The Ceiling: a group other than the replica's (re-created, or set
	// back) may hand out every entry up to the stream's last.
	info, err := r.rdb.XInfoStream(ctx, r.cfg.Stream).Result()
	if err != nil {
		return Settlement{}, fmt.Errorf("while reading Redis stream %s with XINFO STREAM: %w", r.cfg.Stream, err)
	}
	ceiling, err := redisIDCeil(info.LastGeneratedID)
	if err != nil {
		return Settlement{}, fmt.Errorf("last-generated-id of Redis stream %s: %w", r.cfg.Stream, err)
	}
	st.Ceiling = map[string]int64{"stream": max(ceiling, st.Position["stream"])}
	// A Redis group records no creation time: one re-created (or set back)
	// reads like the replica's with nothing pending. So entries not
	// delivered yet count as Unsettled too (the group's lag, or at least
	// one while it trails the stream): "nothing unsettled" then means the
	// group is through the whole stream.
	switch {
	case g.Lag > 0:
		st.Unsettled += g.Lag
		st.Facts += fmt.Sprintf(", %d not delivered yet", g.Lag)
	case g.Lag < 0 && st.Position["stream"] < ceiling:
		st.Unsettled++
		st.Facts += ", entries not delivered yet (lag unknown)"
	}
	return st, nil
}

func redisSettlement(stream, group, last string, pel *redis.XPending) (Settlement, error) {
	position, err := redisIDCeil(last)
	if err != nil {
		return Settlement{}, fmt.Errorf("last-delivered-id of group %s of Redis stream %s: %w", group, stream, err)
	}
	floor, err := redisIDFloor(last)
	if err != nil {
		return Settlement{}, fmt.Errorf("last-delivered-id of group %s of Redis stream %s: %w", group, stream, err)
	}
	facts := fmt.Sprintf("Redis stream %s group %s: last delivered %s, pending 0", stream, group, last)
	if pel.Count > 0 {
		lowest, err := redisIDFloor(pel.Lower)
		if err != nil {
			return Settlement{}, fmt.Errorf("lowest pending ID of group %s of Redis stream %s: %w", group, stream, err)
		}
		floor = lowest - 1
		facts = fmt.Sprintf("Redis stream %s group %s: last delivered %s, pending %d (lowest %s)", stream, group, last, pel.Count, pel.Lower)
	}
	return Settlement{
		Unsettled: pel.Count,
		Position:  map[string]int64{"stream": position},
		Floor:     map[string]int64{"stream": floor},
		// A group's last-delivered-id only goes back when it is
		// re-created or set back (XGROUP SETID).
		Monotonic: []string{"stream"},
		Facts:     facts,
	}, nil
}

// redisIDCeil encodes the entry ID "ms-seq" as ms<<20 | seq, rounding up
// when seq does not fit 20 bits: (ms+1)<<20 lies above every ID of ms.
// Positions use it, so every entry handed out stays at or below.
func redisIDCeil(id string) (int64, error) {
	ms, seq, err := parseRedisID(id)
	if err != nil {
		return 0, err
	}
	if seq >= 1<<redisSeqBits {
		ms, seq = ms+1, 0
	}
	if ms > 1<<(63-redisSeqBits)-1 {
		return 0, fmt.Errorf("entry ID %q is too large to encode", id)
	}
	return int64(ms)<<redisSeqBits | int64(seq), nil
}

// redisIDFloor encodes the entry ID "ms-seq" as ms<<20 | seq, rounding down
// when seq does not fit 20 bits (seq clamped to 1<<20 − 1). Floors use it,
// so no entry above the ID is counted as settled.
func redisIDFloor(id string) (int64, error) {
	ms, seq, err := parseRedisID(id)
	if err != nil {
		return 0, err
	}
	if ms > 1<<(63-redisSeqBits)-1 {
		return 0, fmt.Errorf("entry ID %q is too large to encode", id)
	}
	seq = min(seq, 1<<redisSeqBits-1)
	return int64(ms)<<redisSeqBits | int64(seq), nil
}

// parseRedisID splits "ms-seq"; a bare "ms" has sequence 0.
func parseRedisID(id string) (ms, seq uint64, err error) {
	msPart, seqPart, hasSeq := strings.Cut(id, "-")
	ms, err = strconv.ParseUint(msPart, 10, 64)
	if err == nil && hasSeq {
		seq, err = strconv.ParseUint(seqPart, 10, 64)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("entry ID %q is not ms-seq", id)
	}
	return ms, seq, nil
}
