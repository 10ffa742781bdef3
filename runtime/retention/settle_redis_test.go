package retention

import (
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

func TestSettleRedisIDEncoding(t *testing.T) {
	const seqMax = 1<<20 - 1
	for _, tc := range []struct {
		id          string
		ceil, floor int64
		err         bool
	}{
		{id: "0-0", ceil: 0, floor: 0},
		{id: "0-1", ceil: 1, floor: 1},
		{id: "1-0", ceil: 1 << 20, floor: 1 << 20},
		{id: "1-5", ceil: 1<<20 | 5, floor: 1<<20 | 5},
		{id: "1700000000000-3", ceil: 1700000000000<<20 | 3, floor: 1700000000000<<20 | 3},
		{id: "7", ceil: 7 << 20, floor: 7 << 20},
		{id: "1-1048575", ceil: 1<<20 | seqMax, floor: 1<<20 | seqMax},
		{id: "1-1048576", ceil: 2 << 20, floor: 1<<20 | seqMax},
		{id: "1-18446744073709551615", ceil: 2 << 20, floor: 1<<20 | seqMax},
		{id: "8796093022207-0", ceil: 8796093022207 << 20, floor: 8796093022207 << 20}, // 1<<43 − 1: the largest ms
		{id: "8796093022207-1048576", err: true},                                       // ceil overflows
		{id: "8796093022208-0", err: true},
		{id: "18446744073709551615-18446744073709551615", err: true},
		{id: "", err: true},
		{id: "abc", err: true},
		{id: "1-x", err: true},
		{id: "-1-0", err: true},
	} {
		ceil, cerr := redisIDCeil(tc.id)
		floor, ferr := redisIDFloor(tc.id)
		switch {
		case tc.err && cerr == nil && ferr == nil:
			t.Errorf("%q: ceil %d floor %d, want an error", tc.id, ceil, floor)
		case tc.err:
			continue
		case cerr != nil || ferr != nil:
			t.Errorf("%q: errors %v / %v", tc.id, cerr, ferr)
		case ceil != tc.ceil || floor != tc.floor:
			t.Errorf("%q: ceil %d floor %d, want %d %d", tc.id, ceil, floor, tc.ceil, tc.floor)
		}
	}
	// Order is kept: a later ID never encodes below an earlier one.
	ids := []string{"0-0", "0-1", "1-0", "1-1048575", "1-1048576", "1-5000000", "2-0", "2-1"}
	for i := 1; i < len(ids); i++ {
		a, _ := redisIDCeil(ids[i-1])
		b, _ := redisIDCeil(ids[i])
		c, _ := redisIDFloor(ids[i-1])
		d, _ := redisIDFloor(ids[i])
		if b < a || d < c {
			t.Errorf("%s → %s: ceil %d → %d, floor %d → %d", ids[i-1], ids[i], a, b, c, d)
		}
	}
}

func TestSettleRedisStreams(t *testing.T) {
	rdb := redisClient(t)
	stream := unique("idc-settle")
	t.Cleanup(func() { rdb.Del(testCtx(t), stream) })
	if err := rdb.XGroupCreateMkStream(testCtx(t), stream, "projector", "0").Err(); err != nil {
		t.Fatal(err)
	}
	cfg := redisCfg(stream, config.Retention{})
	at := func(n int64) map[string]int64 { return map[string]int64{"stream": n} }
	wantSettlement(t, mustSettle(t, cfg, nil), 0, at(0), at(0))
	var ids []string
	for i := range settlePublished {
		id, err := rdb.XAdd(testCtx(t), &redis.XAddArgs{Stream: stream, Values: map[string]any{"body": strconv.Itoa(i)}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	ceil := func(id string) int64 {
		n, err := redisIDCeil(id)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	floor := func(id string) int64 {
		n, err := redisIDFloor(id)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	read := func(consumer string, n int64) []string {
		t.Helper()
		res, err := rdb.XReadGroup(testCtx(t), &redis.XReadGroupArgs{Group: "projector", Consumer: consumer, Streams: []string{stream, ">"}, Count: n}).Result()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range res[0].Messages {
			got = append(got, m.ID)
		}
		return got
	}
	ack := func(ids ...string) {
		t.Helper()
		if n, err := rdb.XAck(testCtx(t), stream, "projector", ids...).Result(); err != nil || n != int64(len(ids)) {
			t.Fatalf("XACK %v: %d, %v", ids, n, err)
		}
	}
	// Added, never delivered: nothing can come back to a replica, but a
	// group (perhaps re-created) that has not delivered them is not
	// through the stream: they count as Unsettled.
	wantSettlement(t, mustSettle(t, cfg, nil), settlePublished, at(0), at(0))

	// The replica is handed 6, acknowledges 4 and crashes.
	if got := read("a", settleConsumed); !slices.Equal(got, ids[:settleConsumed]) {
		t.Fatalf("delivered %v, want %v", got, ids[:settleConsumed])
	}
	ack(ids[:settleAcked]...)
	s := mustSettle(t, cfg, nil)
	wantSettlement(t, s, settlePublished-settleAcked, at(ceil(ids[settleConsumed-1])), at(floor(ids[settleAcked])-1))
	stamp := s.Position
	if s.Passed(stamp) {
		t.Fatalf("Passed(%v) with 2 entries pending", stamp)
	}
	if s.Floor["stream"] < ceil(ids[settleAcked-1]) {
		t.Fatalf("floor %d below the 4th acknowledged entry %s", s.Floor["stream"], ids[settleAcked-1])
	}

	// Another consumer takes and acknowledges the 4 never delivered: the
	// crashed replica's 2 pending entries still hold the floor.
	rest := read("b", settlePublished)
	if !slices.Equal(rest, ids[settleConsumed:]) {
		t.Fatalf("delivered %v, want %v", rest, ids[settleConsumed:])
	}
	ack(rest...)
	s = mustSettle(t, cfg, nil)
	wantSettlement(t, s, 2, at(ceil(ids[settlePublished-1])), at(floor(ids[settleAcked])-1))
	if s.Passed(stamp) {
		t.Fatalf("Passed(%v) while the crashed replica's entries are pending", stamp)
	}

	// They are claimed (as the runtime does with XAUTOCLAIM) and acknowledged.
	claimed, _, err := rdb.XAutoClaimJustID(testCtx(t), &redis.XAutoClaimArgs{Stream: stream, Group: "projector", Consumer: "b", Start: "0", Count: 10}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(claimed, ids[settleAcked:settleConsumed]) {
		t.Fatalf("claimed %v, want %v", claimed, ids[settleAcked:settleConsumed])
	}
	ack(claimed...)
	s = mustSettle(t, cfg, nil)
	wantSettlement(t, s, 0, at(ceil(ids[settlePublished-1])), at(floor(ids[settlePublished-1])))
	if !s.Passed(stamp) {
		t.Fatalf("Passed(%v) = false once everything is acknowledged", stamp)
	}

	// A missing group is ErrSourceNotFound.
	missing := redisCfg(stream, config.Retention{})
	missing.Source.RedisStreams.Group = "nobody"
	if _, err := Settle(testCtx(t), missing, nil); !errors.Is(err, ErrSourceNotFound) {
		t.Fatalf("settlement of a missing group: %v, want ErrSourceNotFound", err)
	}
}
