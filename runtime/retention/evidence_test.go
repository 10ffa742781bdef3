package retention

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// TestEvidenceAboutTheConsumer is issue 33's rules for retiring a gone
// replica: a reading proves something only about the consumer the replica
// consumed from.
func TestEvidenceAboutTheConsumer(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	window := time.Minute
	started := now.Add(-time.Hour)
	created := started.Add(-time.Hour)
	recreated := now.Add(-5 * time.Minute)
	js := func(c time.Time) inbox.ConsumerIdentity {
		return inbox.ConsumerIdentity{Kind: "NATSJetStream", Name: "ORDERS/projector", Created: &c}
	}
	redis := inbox.ConsumerIdentity{Kind: "RedisStreams", Name: "s/projector"}
	rabbit := inbox.ConsumerIdentity{Kind: "RabbitMQ", Name: "orders"}
	gone := func(mod func(*inbox.ProgressRecord)) inbox.ProgressRecord {
		r := inbox.ProgressRecord{Replica: "gone", StartedAt: started, HeartbeatAt: now.Add(-10 * time.Minute)}
		mod(&r)
		return r
	}
	old := js(created)
	// A re-created durable: nothing pending, nothing delivered, the stream
	// holds 300 messages.
	fresh := Settlement{Unsettled: 0, Position: map[string]int64{"stream": 0}, Floor: map[string]int64{"stream": 0},
		Ceiling: map[string]int64{"stream": 300}, Monotonic: []string{"stream"}, Consumer: js(recreated)}
	caughtUp := fresh
	caughtUp.Position, caughtUp.Floor = map[string]int64{"stream": 300}, map[string]int64{"stream": 300}
	sameIdle := fresh
	sameIdle.Consumer = old
	sameIdle.Position, sameIdle.Floor = map[string]int64{"stream": 300}, map[string]int64{"stream": 300}
	cases := []struct {
		name   string
		rec    inbox.ProgressRecord
		st     Settlement
		retire bool
		stamp  map[string]int64 // nil: none
		reason []string
	}{
		{name: "the recorded durable with nothing pending: settled", rec: gone(func(r *inbox.ProgressRecord) { r.Consumer = &old }),
			st: sameIdle, retire: true},
		{name: "a durable created after the recorded one proves nothing: stamped with the stream's last sequence",
			rec: gone(func(r *inbox.ProgressRecord) { r.Consumer = &old }), st: fresh,
			stamp: map[string]int64{"stream": 300}, reason: []string{"not of the NATSJetStream consumer ORDERS/projector created", "re-created after its claims proves nothing"}},
		{name: "a record without identity and a durable created after the replica started",
			rec: gone(func(r *inbox.ProgressRecord) {}), st: fresh,
			stamp: map[string]int64{"stream": 300}, reason: []string{"was created after replica gone started"}},
		{name: "a re-created durable stamped with the ceiling holds while its floor is below",
			rec: gone(func(r *inbox.ProgressRecord) { r.Consumer = &old; r.SettleMark = map[string]int64{"stream": 300} }), st: fresh,
			reason: []string{"stream is at 0, below 300, the mark stamped", "re-created or reset"}},
		{name: "a re-created durable whose floor passed the ceiling stamp releases",
			rec: gone(func(r *inbox.ProgressRecord) { r.Consumer = &old; r.SettleMark = map[string]int64{"stream": 300} }), st: caughtUp, retire: true},
		{name: "another consumer name proves nothing",
			rec: gone(func(r *inbox.ProgressRecord) { c := old; c.Name = "ORDERS/other"; r.Consumer = &c }), st: sameIdle,
			stamp: map[string]int64{"stream": 300}, reason: []string{"not of the NATSJetStream consumer ORDERS/other"}},
		{name: "redis: a group whose delivery went back below what the replica claimed is another consumer",
			rec: gone(func(r *inbox.ProgressRecord) { r.Consumer = &redis; r.Positions = map[string]int64{"stream": 5000} }),
			st: Settlement{Position: map[string]int64{"stream": 0}, Floor: map[string]int64{"stream": 0}, Ceiling: map[string]int64{"stream": 9000},
				Monotonic: []string{"stream"}, Consumer: redis},
			stamp: map[string]int64{"stream": 9000}, reason: []string{"stream is at 0, below 5000, what the replica claimed"}},
		{name: "redis: the same group, delivered past the claims, nothing pending: settled",
			rec:    gone(func(r *inbox.ProgressRecord) { r.Consumer = &redis; r.Positions = map[string]int64{"stream": 5000} }),
			st:     Settlement{Position: map[string]int64{"stream": 6000}, Floor: map[string]int64{"stream": 6000}, Monotonic: []string{"stream"}, Consumer: redis},
			retire: true},
		{name: "redis: a replica that died before reporting positions is stamped with the stream's last entry",
			rec: gone(func(r *inbox.ProgressRecord) { r.Consumer = &redis }),
			st: Settlement{Unsettled: 300, Position: map[string]int64{"stream": 0}, Floor: map[string]int64{"stream": 0}, Ceiling: map[string]int64{"stream": 9000},
				Monotonic: []string{"stream"}, Consumer: redis},
			stamp: map[string]int64{"stream": 9000}},
		{name: "redis: a group set back below the stamp holds",
			rec:    gone(func(r *inbox.ProgressRecord) { r.Consumer = &redis; r.SettleMark = map[string]int64{"stream": 6000} }),
			st:     Settlement{Position: map[string]int64{"stream": 10}, Floor: map[string]int64{"stream": 10}, Monotonic: []string{"stream"}, Consumer: redis},
			reason: []string{"below 6000, the mark stamped"}},
		{name: "rabbitmq: missing counters are unknown, never 0",
			rec: gone(func(r *inbox.ProgressRecord) { r.Consumer = &rabbit }),
			st:  rabbitSettlement("orders", "/", rabbitQueueSettlement{}), reason: []string{"did not report [messages_ready messages_unacknowledged message_stats.ack]"}},
		{name: "rabbitmq: as many acknowledgements since the stamp as the queue held: settled",
			rec: gone(func(r *inbox.ProgressRecord) {
				r.Consumer = &rabbit
				r.SettleMark = map[string]int64{"acks": 1300, rabbitAckCount: 1000}
			}),
			st: rabbitSettlement("orders", "/", queueCounts(4, 0, 1500)), retire: true},
		{name: "rabbitmq: a reset counter: acks 200 after a stamp at 1000",
			rec: gone(func(r *inbox.ProgressRecord) {
				r.Consumer = &rabbit
				r.SettleMark = map[string]int64{"acks": 1300, rabbitAckCount: 1000}
			}),
			st:     rabbitSettlement("orders", "/", queueCounts(0, 0, 200)),
			reason: []string{"ackCount is at 200, below 1000", "reset"}},
		{name: "rabbitmq: an empty queue that never had an ack is settled",
			rec: gone(func(r *inbox.ProgressRecord) { r.Consumer = &rabbit }),
			st:  rabbitSettlement("orders", "/", rabbitQueueSettlement{Ready: ptr64(0), Unacked: ptr64(0)}), retire: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := BoundByProgress(now, window, []inbox.ProgressRecord{tc.rec}, tc.st, nil)
			retired := len(h.Retire) == 1
			if retired != tc.retire {
				t.Fatalf("retired=%v, want %v (reason %q, evidence %v)", retired, tc.retire, h.Reason, h.Evidence)
			}
			if got := h.Marks[tc.rec.Replica]; !maps.Equal(got, tc.stamp) || (tc.stamp != nil) != (len(h.Stamp) == 1) {
				t.Errorf("stamp %v (%d records), want %v", got, len(h.Stamp), tc.stamp)
			}
			if tc.retire {
				if h.Held() {
					t.Errorf("retired yet held: %s", h.Reason)
				}
				return
			}
			if !h.Held() {
				t.Fatalf("not held")
			}
			for _, want := range tc.reason {
				if !strings.Contains(h.Reason, want) {
					t.Errorf("reason %q lacks %q", h.Reason, want)
				}
			}
			t.Logf("held: %s", h.Reason)
		})
	}
}

func ptr64(n int64) *int64 { return &n }

func queueCounts(ready, unacked, acks int64) rabbitQueueSettlement {
	q := rabbitQueueSettlement{Ready: ptr64(ready), Unacked: ptr64(unacked)}
	q.Messages = &struct {
		Ack *int64 `json:"ack"`
	}{Ack: ptr64(acks)}
	return q
}

// TestJetStreamStoredMessagesAreOutstanding: on workqueue and interest
// streams a message still stored at or below the delivered sequence is not
// settled, whatever the durable reports; on a limits stream stored messages
// are the history.
func TestJetStreamStoredMessagesAreOutstanding(t *testing.T) {
	info := &jetstream.ConsumerInfo{Delivered: jetstream.SequenceInfo{Stream: 300}, AckFloor: jetstream.SequenceInfo{Stream: 300}}
	for _, tc := range []struct {
		policy        jetstream.RetentionPolicy
		msgs          uint64
		first         uint64
		wantFloor     int64
		wantUnsettled int64
	}{
		{jetstream.WorkQueuePolicy, 200, 101, 100, 200},
		{jetstream.InterestPolicy, 1, 300, 299, 1},
		{jetstream.WorkQueuePolicy, 0, 301, 300, 0},
		{jetstream.WorkQueuePolicy, 5, 301, 300, 0}, // stored above the delivered: not yet handed out
		{jetstream.LimitsPolicy, 300, 1, 300, 0},
	} {
		si := &jetstream.StreamInfo{Config: jetstream.StreamConfig{Retention: tc.policy},
			State: jetstream.StreamState{Msgs: tc.msgs, FirstSeq: tc.first, LastSeq: tc.first + tc.msgs - 1}}
		s := jetStreamSettlement("c", "S", info, si)
		if s.Floor["stream"] != tc.wantFloor || s.Unsettled != tc.wantUnsettled {
			t.Errorf("%s, %d stored from %d: floor %d unsettled %d, want %d and %d (%s)", retentionName(tc.policy), tc.msgs, tc.first,
				s.Floor["stream"], s.Unsettled, tc.wantFloor, tc.wantUnsettled, s.Facts)
		}
		if s.Passed(map[string]int64{"stream": 300}) != (tc.wantFloor >= 300) {
			t.Errorf("%s: Passed(300) = %v", retentionName(tc.policy), tc.wantFloor < 300)
		}
	}
}
