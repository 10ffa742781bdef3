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
func (r *redisInspector) lag(ctx context.Context) (int64, error) {
	opts, err := r.options()
	if err != nil {
		return 0, err
	}
	rdb := redis.NewClient(opts)
	defer func() { _ = rdb.Close() }()
	groups, err := rdb.XInfoGroups(ctx, r.cfg.Stream).Result()
	switch {
	case err != nil && strings.Contains(err.Error(), "no such key"):
		return 0, fmt.Errorf("%w: Redis stream %s", ErrSourceNotFound, r.cfg.Stream)
	case err != nil && redisUnreachable(err):
		return 0, unreachable("reading the groups of Redis stream "+r.cfg.Stream, err)
	case err != nil:
		return 0, fmt.Errorf("while reading the groups of Redis stream %s with XINFO GROUPS: %w", r.cfg.Stream, err)
	}
	for _, g := range groups {
		if g.Name != r.cfg.Group {
			continue
		}
		if g.Lag < 0 {
			return 0, fmt.Errorf("group %s of stream %s: %w", r.cfg.Group, r.cfg.Stream, errLagUnknown)
		}
		return g.Lag, nil
	}
	return 0, fmt.Errorf("%w: group %s of Redis stream %s", ErrSourceNotFound, r.cfg.Group, r.cfg.Stream)
}
