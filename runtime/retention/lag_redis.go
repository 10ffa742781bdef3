package retention

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// errLagUnknown: Redis cannot tell a group's lag after entries were
// deleted from the middle of the stream (XINFO GROUPS reports -1).
var errLagUnknown = errors.New("XINFO GROUPS cannot determine the lag")

// lag is the group's lag from XINFO GROUPS: entries not yet delivered to it.
func (r *redisSession) lag(ctx context.Context) (int64, error) {
	g, err := r.group(ctx)
	if err != nil {
		return 0, err
	}
	if g.Lag < 0 {
		return 0, fmt.Errorf("group %s of stream %s: %w", r.cfg.Group, r.cfg.Stream, errLagUnknown)
	}
	return g.Lag, nil
}

// group reads the consumer group with XINFO GROUPS; a missing stream or
// group is ErrSourceNotFound.
func (r *redisSession) group(ctx context.Context) (redis.XInfoGroup, error) {
	groups, err := r.rdb.XInfoGroups(ctx, r.cfg.Stream).Result()
	switch {
	case err != nil && strings.Contains(err.Error(), "no such key"):
		return redis.XInfoGroup{}, fmt.Errorf("%w: Redis stream %s", ErrSourceNotFound, r.cfg.Stream)
	case err != nil && redisUnreachable(err):
		return redis.XInfoGroup{}, unreachable("reading the groups of Redis stream "+r.cfg.Stream, err)
	case err != nil:
		return redis.XInfoGroup{}, fmt.Errorf("while reading the groups of Redis stream %s with XINFO GROUPS: %w", r.cfg.Stream, err)
	}
	for _, g := range groups {
		if g.Name == r.cfg.Group {
			return g, nil
		}
	}
	return redis.XInfoGroup{}, fmt.Errorf("%w: group %s of Redis stream %s", ErrSourceNotFound, r.cfg.Group, r.cfg.Stream)
}
