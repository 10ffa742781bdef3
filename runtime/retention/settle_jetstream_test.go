package retention

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

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
