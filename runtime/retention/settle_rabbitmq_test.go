package retention

import (
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

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
