package retention

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const redisAddr = "127.0.0.1:6379"

func redisClient(t *testing.T) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(testCtx(t)).Err(); err != nil {
		t.Fatalf("Redis is not reachable at %s (start it with `make services`): %v", redisAddr, err)
	}
	return rdb
}

func redisCfg(stream string, r config.Retention) *config.Config {
	return baseConfig(config.Source{RedisStreams: &config.RedisStreams{Address: redisAddr, Stream: stream, Group: "projector",
		ClaimMinIdle: config.Duration{Duration: 30 * time.Second}}}, r)
}

func TestRedisLive(t *testing.T) {
	rdb := redisClient(t)
	stream := unique("idc-ret")
	t.Cleanup(func() { rdb.Del(testCtx(t), stream) })
	cfg := redisCfg(stream, retention(24*time.Hour, time.Hour, 0))

	// Nothing bounds a Redis stream: maxReplayAge is required.
	_, err := Derive(testCtx(t), cfg, nil, time.Now())
	if !errors.Is(err, ErrUnboundedReplay) || !strings.Contains(err.Error(), "maxReplayAge") {
		t.Fatalf("want ErrUnboundedReplay naming maxReplayAge, got %v", err)
	}

	cfg.Retention.MaxReplayAge.Duration = 720 * time.Hour
	res := mustDerive(t, cfg, nil)
	wantWindow(t, res, 721*time.Hour, "stream "+stream+" does not exist yet", "claimMinIdle=30s", "A=∞")
	if res.Source != SourceDeclared {
		t.Errorf("source %s", res.Source)
	}

	// An entry written an hour ago (explicit id): when it was written is
	// reported, for information only; the window and the inputs hash do
	// not move, and a second read says exactly the same.
	old := time.Now().Add(-time.Hour).UnixMilli()
	if err := rdb.XAdd(testCtx(t), &redis.XAddArgs{Stream: stream, ID: strconv.FormatInt(old, 10) + "-0", Values: map[string]any{"body": "x"}}).Err(); err != nil {
		t.Fatal(err)
	}
	res2 := mustDerive(t, cfg, nil)
	wantWindow(t, res2, 721*time.Hour, "first entry "+strconv.FormatInt(old, 10)+"-0 written "+time.UnixMilli(old).UTC().Format(time.RFC3339))
	if res2.InputsHash != res.InputsHash {
		t.Error("informational observation changed the inputs hash")
	}
	if err := rdb.XAdd(testCtx(t), &redis.XAddArgs{Stream: stream, Values: map[string]any{"body": "y"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if res3 := mustDerive(t, cfg, nil); res3.DerivedFrom != res2.DerivedFrom {
		t.Errorf("derivedFrom moved with a new entry, not a trim:\n%s\n%s", res2.DerivedFrom, res3.DerivedFrom)
	}

	// maxReplayAge changes: Derive follows.
	cfg.Retention.MaxReplayAge.Duration = 48 * time.Hour
	wantWindow(t, mustDerive(t, cfg, nil), 49*time.Hour, "maxReplayAge=48h (spec)")
}

func TestRedisLiveErrors(t *testing.T) {
	redisClient(t)
	cfg := baseConfig(config.Source{RedisStreams: &config.RedisStreams{Address: "127.0.0.1:1", Stream: "s", Group: "g", PasswordEnv: "PW"}},
		retention(time.Hour, time.Hour, time.Hour))
	wantUnreachable(t, cfg, envMap(map[string]string{"PW": "s3cret-pw"}), "s3cret-pw")

}
