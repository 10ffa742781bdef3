package retention

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

func TestSettleKafka(t *testing.T) {
	c, adm := kfakeCluster(t, kfake.SeedTopics(2, "orders"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("orders"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	// 10 records on partition 0, 3 on partition 1.
	for i := range settlePublished + 3 {
		rec := &kgo.Record{Partition: int32(i / settlePublished), Value: []byte(strconv.Itoa(i))}
		if err := cl.ProduceSync(testCtx(t), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cfg := kafkaCfg(c, config.Retention{}, "orders")
	parts := func(p0, p1 int64) map[string]int64 { return map[string]int64{"orders/0": p0, "orders/1": p1} }
	// The group does not exist yet: everything from the start offsets can come.
	wantSettlement(t, mustSettle(t, cfg, nil), 13, parts(10, 3), parts(0, 0))

	// The replica is handed partition 0's records and commits after the
	// first 4 of the 6 it processed, then crashes.
	consumer, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"orders": {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	var handed []*kgo.Record
	for len(handed) < settleConsumed {
		fs := consumer.PollFetches(testCtx(t))
		if err := fs.Err(); err != nil {
			t.Fatal(err)
		}
		handed = append(handed, fs.Records()...)
	}
	consumer.Close()
	commit := func(p0, p1 int64) {
		t.Helper()
		offsets := kadm.Offsets{}
		offsets.Add(kadm.Offset{Topic: "orders", Partition: 0, At: p0, LeaderEpoch: -1})
		if p1 >= 0 {
			offsets.Add(kadm.Offset{Topic: "orders", Partition: 1, At: p1, LeaderEpoch: -1})
		}
		resp, err := adm.CommitOffsets(testCtx(t), "projector", offsets)
		if err == nil {
			err = resp.Error()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	commit(handed[settleAcked-1].Offset+1, -1)
	s := mustSettle(t, cfg, nil)
	wantSettlement(t, s, (10-settleAcked)+3, parts(10, 3), parts(settleAcked, 0))
	stamp := s.Position
	if s.Passed(stamp) {
		t.Fatalf("Passed(%v) with records past the commit", stamp)
	}
	if !strings.Contains(s.Facts, "orders/0 committed 4 end 10, orders/1 start 0 end 3") {
		t.Errorf("facts %q", s.Facts)
	}

	// Records deleted below the start offset are gone: partition 1 floors there.
	del := kadm.Offsets{}
	del.Add(kadm.Offset{Topic: "orders", Partition: 1, At: 2})
	dr, err := adm.DeleteRecords(testCtx(t), del)
	if err == nil {
		err = dr.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	wantSettlement(t, mustSettle(t, cfg, nil), (10-settleAcked)+1, parts(10, 3), parts(settleAcked, 2))

	// A restarted replica is handed exactly what lies between floor and
	// end, and commits it all.
	restarted, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup("projector"), kgo.ConsumeTopics("orders"),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restarted.Close)
	var again []string
	for len(again) < (10-settleAcked)+1 {
		fs := restarted.PollFetches(testCtx(t))
		if err := fs.Err(); err != nil {
			t.Fatal(err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			again = append(again, r.Topic+"/"+strconv.Itoa(int(r.Partition))+"@"+strconv.FormatInt(r.Offset, 10))
		})
	}
	slices.Sort(again)
	if want := []string{"orders/0@4", "orders/0@5", "orders/0@6", "orders/0@7", "orders/0@8", "orders/0@9", "orders/1@2"}; !slices.Equal(again, want) {
		t.Fatalf("handed again %v, want %v", again, want)
	}
	if err := restarted.CommitUncommittedOffsets(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	s = mustSettle(t, cfg, nil)
	wantSettlement(t, s, 0, parts(10, 3), parts(10, 3))
	if !s.Passed(stamp) {
		t.Fatalf("Passed(%v) = false once everything is committed", stamp)
	}
}

func TestSettleKafkaMissingTopicIsSourceNotFound(t *testing.T) {
	c, _ := kfakeCluster(t)
	_, err := Settle(testCtx(t), kafkaCfg(c, config.Retention{}, unique("missing")), nil)
	if !errors.Is(err, ErrSourceNotFound) {
		t.Fatalf("settlement of a missing topic: %v, want ErrSourceNotFound", err)
	}
}
