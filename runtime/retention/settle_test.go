package retention

// Settle against the live services (and franz-go's in-process kfake cluster
// for Kafka): a consumer is handed some messages, acknowledges only some,
// and the settlement must say what can still come back.

import (
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const (
	settlePublished = 10
	settleConsumed  = 6
	settleAcked     = 4
)

func mustSettle(t *testing.T, cfg *config.Config, getenv Getenv) Settlement {
	t.Helper()
	s, err := Settle(testCtx(t), cfg, getenv)
	if err != nil {
		t.Fatalf("Settle: %v", err)
	}
	t.Logf("settlement: unsettled=%d position=%v floor=%v facts=%q", s.Unsettled, s.Position, s.Floor, s.Facts)
	return s
}

// wantSettlement fails unless s has exactly these numbers.
func wantSettlement(t *testing.T, s Settlement, unsettled int64, position, floor map[string]int64) {
	t.Helper()
	if s.Unsettled != unsettled || !maps.Equal(s.Position, position) || !maps.Equal(s.Floor, floor) {
		t.Fatalf("settlement unsettled=%d position=%v floor=%v; want unsettled=%d position=%v floor=%v (%s)",
			s.Unsettled, s.Position, s.Floor, unsettled, position, floor, s.Facts)
	}
}

func TestSettlePassed(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Settlement
		mark map[string]int64
		want bool
	}{
		{"nil mark: nothing to wait for", Settlement{Unsettled: 3, Floor: map[string]int64{"stream": 1}}, nil, true},
		{"key missing from Floor", Settlement{Unsettled: 3, Floor: map[string]int64{"t/0": 9}}, map[string]int64{"t/1": 1}, false},
		{"nil Floor", Settlement{Unsettled: 3}, map[string]int64{"stream": 0}, false},
		{"nothing unsettled", Settlement{Unsettled: 0, Floor: map[string]int64{"stream": 1}}, map[string]int64{"stream": 100, "other": 5}, true},
		{"floor equals mark", Settlement{Unsettled: 2, Floor: map[string]int64{"stream": 6}}, map[string]int64{"stream": 6}, true},
		{"floor above mark", Settlement{Unsettled: 2, Floor: map[string]int64{"stream": 7}}, map[string]int64{"stream": 6}, true},
		{"floor below mark", Settlement{Unsettled: 2, Floor: map[string]int64{"stream": 5}}, map[string]int64{"stream": 6}, false},
		{"one key of two below", Settlement{Unsettled: 1, Floor: map[string]int64{"t/0": 10, "t/1": 2}}, map[string]int64{"t/0": 10, "t/1": 3}, false},
		{"every key passed", Settlement{Unsettled: 1, Floor: map[string]int64{"t/0": 10, "t/1": 3, "t/2": 0}}, map[string]int64{"t/0": 10, "t/1": 3}, true},
	} {
		if got := tc.s.Passed(tc.mark); got != tc.want {
			t.Errorf("%s: Passed(%v) with floor %v unsettled %d = %v, want %v", tc.name, tc.mark, tc.s.Floor, tc.s.Unsettled, got, tc.want)
		}
	}
}

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

func TestSettleJetStream(t *testing.T) {
	js := natsJS(t)
	name := unique("IDC_SETTLE")
	createStream(t, js, jetstream.StreamConfig{Name: name})
	const ackWait = 5 * time.Second
	c, err := js.CreateConsumer(testCtx(t), name, jetstream.ConsumerConfig{Durable: "projector", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	cfg := jsConfig(name, "projector", config.Retention{})
	stream := func(n int64) map[string]int64 { return map[string]int64{"stream": n} }
	wantSettlement(t, mustSettle(t, cfg, nil), 0, stream(0), stream(0))
	for i := range settlePublished {
		if _, err := js.Publish(testCtx(t), strings.ToLower(name)+".orders", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	// Published, never delivered: nothing was handed out, nothing can come back.
	wantSettlement(t, mustSettle(t, cfg, nil), 0, stream(0), stream(0))

	// The replica is handed 6, acknowledges 4, and crashes.
	fetch := func(n int) []jetstream.Msg {
		t.Helper()
		batch, err := c.Fetch(n, jetstream.FetchMaxWait(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var msgs []jetstream.Msg
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
		return msgs
	}
	ack := func(m jetstream.Msg) uint64 {
		t.Helper()
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if err := m.DoubleAck(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		return md.Sequence.Stream
	}
	handed := fetch(settleConsumed)
	if len(handed) != settleConsumed {
		t.Fatalf("fetched %d, want %d", len(handed), settleConsumed)
	}
	var acked []uint64
	for _, m := range handed[:settleAcked] {
		acked = append(acked, ack(m))
	}
	s := mustSettle(t, cfg, nil)
	wantSettlement(t, s, settleConsumed-settleAcked, stream(settleConsumed), stream(settleAcked))
	stamp := s.Position
	if s.Passed(stamp) {
		t.Fatalf("Passed(%v) with 2 deliveries unacknowledged", stamp)
	}
	if want := "on stream " + name + ": ack floor 4, delivered 6, ack pending 2; stream " + name + " retention limits: 10 messages stored, sequences 1-10"; !strings.HasPrefix(s.Facts, "JetStream consumer projector (created ") || !strings.HasSuffix(s.Facts, want) {
		t.Errorf("facts %q, want %q", s.Facts, want)
	}

	// Another replica takes the 4 never delivered (7..10) before ack_wait
	// hands 5 and 6 out again: the ack floor stays below them.
	var second []uint64
	for _, m := range fetch(4) {
		second = append(second, ack(m))
	}
	if !slices.Equal(second, []uint64{7, 8, 9, 10}) {
		t.Fatalf("second fetch acknowledged stream sequences %v, want [7 8 9 10]", second)
	}
	acked = append(acked, second...)
	s = mustSettle(t, cfg, nil)
	wantSettlement(t, s, 2, stream(settlePublished), stream(settleAcked))
	if s.Passed(stamp) {
		t.Fatalf("Passed(%v) while 5 and 6 are still unacknowledged", stamp)
	}

	// After ack_wait, 5 and 6 come back; acknowledging them settles everything.
	deadline := time.Now().Add(ackWait + 15*time.Second)
	for len(acked) < settlePublished {
		if time.Now().After(deadline) {
			t.Fatalf("only stream sequences %v acknowledged; 5 and 6 were not redelivered", acked)
		}
		for _, m := range fetch(settlePublished) {
			acked = append(acked, ack(m))
		}
	}
	slices.Sort(acked)
	if !slices.Equal(acked, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
		t.Fatalf("acknowledged stream sequences %v", acked)
	}
	s = mustSettle(t, cfg, nil)
	wantSettlement(t, s, 0, stream(settlePublished), stream(settlePublished))
	if !s.Passed(stamp) {
		t.Fatalf("Passed(%v) = false once everything is acknowledged", stamp)
	}
	info, err := c.Info(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != settlePublished {
		t.Errorf("broker ack floor %d, want %d", info.AckFloor.Stream, settlePublished)
	}
}

func TestSettleOfAMissingConsumerIsSourceNotFound(t *testing.T) {
	js := natsJS(t)
	name := unique("IDC_SETTLE")
	createStream(t, js, jetstream.StreamConfig{Name: name})
	_, err := Settle(testCtx(t), jsConfig(name, "nobody", config.Retention{}), nil)
	if !errors.Is(err, ErrSourceNotFound) {
		t.Fatalf("settlement of a missing consumer: %v, want ErrSourceNotFound", err)
	}
	if !strings.Contains(err.Error(), "while reading the settlement from ") {
		t.Errorf("error %q lacks the settlement context", err)
	}
}

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

// eventuallySettled polls the management API until cond holds: its
// statistics refresh every 5 s by default.
func eventuallySettled(t *testing.T, cfg *config.Config, what string, cond func(Settlement) bool) Settlement {
	t.Helper()
	var (
		s   Settlement
		err error
	)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if s, err = Settle(testCtx(t), cfg, rabbitEnv); err == nil && cond(s) {
			t.Logf("settlement: unsettled=%d position=%v floor=%v facts=%q", s.Unsettled, s.Position, s.Floor, s.Facts)
			return s
		}
	}
	t.Fatalf("%s: never seen; last settlement unsettled=%d position=%v floor=%v facts=%q, error %v", what, s.Unsettled, s.Position, s.Floor, s.Facts, err)
	return s
}

func TestSettleRabbitMQ(t *testing.T) {
	ch := amqpChannel(t)
	q := declareQueue(t, ch, nil)
	cfg := rabbitCfg(q, config.Retention{})
	acks := func(n int64) map[string]int64 { return map[string]int64{"acks": n} }
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for i := range settlePublished {
		dc, err := ch.PublishWithDeferredConfirmWithContext(testCtx(t), "", q, false, false, amqp.Publishing{Body: []byte(strconv.Itoa(i))})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(testCtx(t)); !ok || err != nil {
			t.Fatalf("publish %d not confirmed: %v", i, err)
		}
	}
	eventuallySettled(t, cfg, "10 ready", func(s Settlement) bool { return s.Unsettled == settlePublished })

	// The replica is handed 6 (prefetch 6, manual acks), acknowledges 4
	// and crashes: its connection closes and RabbitMQ requeues the other 2.
	conn, err := amqp.Dial(amqpURI)
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable: %v", err)
	}
	crashed, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := crashed.Qos(settleConsumed, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := crashed.Consume(q, "crashed", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var handed []amqp.Delivery
	for range settleConsumed {
		select {
		case d := <-deliveries:
			handed = append(handed, d)
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d deliveries", len(handed))
		}
	}
	// Each acknowledgement frees a prefetch slot: cancel the consumer first
	// so the broker hands it nothing more than these 6.
	if err := crashed.Cancel("crashed", false); err != nil {
		t.Fatal(err)
	}
	for _, d := range handed[:settleAcked] {
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	// The acknowledgements must reach the broker before the crash.
	eventuallySettled(t, cfg, "4 acknowledged, 2 unacknowledged", func(s Settlement) bool {
		return s.Floor["acks"] == settleAcked && strings.Contains(s.Facts, "ready 4, unacknowledged 2")
	})
	_ = conn.Close()

	s := eventuallySettled(t, cfg, "2 requeued", func(s Settlement) bool { return strings.Contains(s.Facts, "ready 6, unacknowledged 0") })
	withCount := func(m map[string]int64, n int64) map[string]int64 { m[rabbitAckCount] = n; return m }
	wantSettlement(t, s, settlePublished-settleAcked, withCount(acks(settlePublished), settleAcked), withCount(acks(settleAcked), settleAcked))
	stamp := s.Position
	if s.Passed(stamp) {
		t.Fatalf("Passed(%v) with 6 messages in the queue", stamp)
	}

	// A restarted replica is handed the 2 requeued first, then the rest,
	// and acknowledges everything.
	ch2 := amqpChannel(t)
	again, err := ch2.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range settlePublished - settleAcked {
		var d amqp.Delivery
		select {
		case d = <-again:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d deliveries after the crash", i)
		}
		if i < settleConsumed-settleAcked {
			if want := string(handed[settleAcked+i].Body); !d.Redelivered || string(d.Body) != want {
				t.Errorf("delivery %d after the crash: body %q redelivered=%v, want the requeued %q first", i, d.Body, d.Redelivered, want)
			}
		} else if d.Redelivered {
			t.Errorf("delivery %d after the crash: body %q redelivered, want a first delivery", i, d.Body)
		}
		if err := d.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	// The statistics refresh the ack counter and the queue depth apart
	// (either can lag the other), and Passed holds as soon as the depth is
	// 0: wait until both show the end.
	s = eventuallySettled(t, cfg, "everything acknowledged", func(s Settlement) bool {
		return s.Unsettled == 0 && s.Floor["acks"] == settlePublished
	})
	if !s.Passed(stamp) {
		t.Fatalf("everything acknowledged, yet Passed(%v) is false", stamp)
	}
	wantSettlement(t, s, 0, withCount(acks(settlePublished), settlePublished), withCount(acks(settlePublished), settlePublished))
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
