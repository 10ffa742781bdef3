package kafka

// There is no Kafka server on this machine: these tests run against
// franz-go's in-process kfake cluster (github.com/twmb/franz-go/pkg/kfake),
// which speaks the Kafka protocol over loopback, including consumer groups,
// offset commits and SASL.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
	"github.com/idempotency-dev/idc-operator/runtime/source/sourcetest"
)

type fixture struct {
	cluster *kfake.Cluster
	topic   string
	group   string
	// clientOpts authenticate test producers and admins when SASL is on.
	clientOpts []kgo.Opt
}

func newFixture(t *testing.T, partitions int32, opts ...kfake.Opt) *fixture {
	t.Helper()
	id := time.Now().UnixNano()
	f := &fixture{topic: fmt.Sprintf("idc-test-%d", id), group: fmt.Sprintf("idc-test-group-%d", id)}
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(partitions, f.topic)}, opts...)...)
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	f.cluster = c
	return f
}

func (f *fixture) client(t *testing.T) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(f.cluster.ListenAddrs()...)}, f.clientOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func (f *fixture) publish(t *testing.T, msgs []sourcetest.Outgoing) {
	t.Helper()
	cl := f.client(t)
	recs := make([]*kgo.Record, len(msgs))
	for i, o := range msgs {
		recs[i] = &kgo.Record{
			Topic: f.topic,
			// Keyed, so records spread over the partitions: unkeyed ones
			// may all land in one (sticky partitioning), and a member
			// assigned the other partition would then see nothing.
			Key:     []byte(o.ID),
			Value:   o.Body,
			Headers: []kgo.RecordHeader{{Key: sourcetest.IDHeader, Value: []byte(o.ID)}},
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing: %v", err)
	}
}

func (f *fixture) cfg() *config.Kafka {
	return &config.Kafka{BootstrapServers: f.cluster.ListenAddrs(), Topics: []string{f.topic}, ConsumerGroup: f.group}
}

func newSource(t *testing.T, cfg *config.Kafka) *Source {
	t.Helper()
	s, err := New(t.Context(), cfg, testr.New(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	// One partition, so "the first delivered record" is the lowest offset
	// and acknowledging it alone leaves the others uncommitted.
	f := newFixture(t, 1)
	sourcetest.Run(t, sourcetest.Harness{
		NewSource:       func(t *testing.T) source.Source { return newSource(t, f.cfg()) },
		Publish:         f.publish,
		MaxWait:         300 * time.Millisecond,
		RedeliveryAfter: 2 * time.Second,
	})
}

func TestNativeIDAndHeaders(t *testing.T) {
	f := newFixture(t, 1)
	f.publish(t, []sourcetest.Outgoing{{ID: "a", Body: []byte("1")}})
	s := newSource(t, f.cfg())
	defer s.Close()
	msgs := fetchN(t, s, 1)
	if want := f.topic + "/0/0"; msgs[0].NativeID != want {
		t.Errorf("NativeID %q, want %q", msgs[0].NativeID, want)
	}
	if msgs[0].Headers[sourcetest.IDHeader] != "a" || msgs[0].Attempt != 0 {
		t.Errorf("headers %v attempt %d", msgs[0].Headers, msgs[0].Attempt)
	}
	if err := s.Ack(t.Context(), msgs); err != nil {
		t.Fatal(err)
	}
}

// fetchN fetches until exactly n records arrived.
func fetchN(t *testing.T, s *Source, n int) []source.Message {
	t.Helper()
	var out []source.Message
	deadline := time.Now().Add(30 * time.Second)
	for len(out) < n && time.Now().Before(deadline) {
		msgs, err := s.Fetch(t.Context(), n-len(out), 200*time.Millisecond)
		if err != nil {
			t.Fatalf("Fetch: %v", err)
		}
		out = append(out, msgs...)
	}
	if len(out) != n {
		t.Fatalf("fetched %d records, want %d", len(out), n)
	}
	return out
}

// TestLateAckDoesNotRewind acknowledges a later batch before an earlier one:
// the committed offset must stay at the later one.
func TestLateAckDoesNotRewind(t *testing.T) {
	f := newFixture(t, 1)
	f.publish(t, []sourcetest.Outgoing{{ID: "a", Body: []byte("1")}, {ID: "b", Body: []byte("2")}, {ID: "c", Body: []byte("3")}, {ID: "d", Body: []byte("4")}})
	s := newSource(t, f.cfg())
	defer s.Close()
	first := fetchN(t, s, 2)
	second := fetchN(t, s, 2)
	if err := s.Ack(t.Context(), second); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(f.client(t))
	offsets, err := adm.FetchOffsets(t.Context(), f.group)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := offsets.Lookup(f.topic, 0)
	if !ok || o.At != 4 {
		t.Fatalf("committed offset %+v (found %v), want 4", o, ok)
	}
}

// TestCommitStopsAtLowestUnacknowledged: two in-flight lanes hold
// interleaved records of one partition. Acknowledging the odd lane first
// commits nothing past the lowest outstanding record (offset 0); once the
// even lane is acknowledged too, the commit covers all six.
func TestCommitStopsAtLowestUnacknowledged(t *testing.T) {
	f := newFixture(t, 1)
	var out []sourcetest.Outgoing
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		out = append(out, sourcetest.Outgoing{ID: id, Body: []byte(id)})
	}
	f.publish(t, out)
	s := newSource(t, f.cfg())
	defer s.Close()
	msgs := fetchN(t, s, 6)
	var even, odd []source.Message
	for i, m := range msgs {
		if i%2 == 0 {
			even = append(even, m)
		} else {
			odd = append(odd, m)
		}
	}
	committed := func() int64 {
		t.Helper()
		offsets, err := kadm.NewClient(f.client(t)).FetchOffsets(t.Context(), f.group)
		if err != nil {
			t.Fatal(err)
		}
		o, ok := offsets.Lookup(f.topic, 0)
		if !ok {
			return -1
		}
		return o.At
	}
	if err := s.Ack(t.Context(), odd); err != nil {
		t.Fatal(err)
	}
	if at := committed(); at > 0 {
		t.Fatalf("after acknowledging offsets 1,3,5 the group committed %d, past the outstanding offset 0", at)
	}
	if err := s.Ack(t.Context(), even[:1]); err != nil {
		t.Fatal(err)
	}
	if at := committed(); at != 2 {
		t.Fatalf("after acknowledging 0 as well: committed %d, want 2 (offset 2 is outstanding)", at)
	}
	if err := s.Ack(t.Context(), even[1:]); err != nil {
		t.Fatal(err)
	}
	if at := committed(); at != 6 {
		t.Fatalf("after acknowledging everything: committed %d, want 6", at)
	}
}

// TestTwoMembersShareTheGroup runs two sources in one group on a
// two-partition topic: every record is delivered, and a record whose
// member leaves unacknowledged is consumed by the remaining member.
func TestTwoMembersShareTheGroup(t *testing.T) {
	f := newFixture(t, 2)
	var out []sourcetest.Outgoing
	for i := range 20 {
		out = append(out, sourcetest.Outgoing{ID: fmt.Sprint(i), Body: fmt.Appendf(nil, "%d", i)})
	}
	f.publish(t, out)
	a, b := newSource(t, f.cfg()), newSource(t, f.cfg())
	defer b.Close()
	seen := map[string]int{}
	// a fetches once and leaves without acknowledging.
	var aMsgs []source.Message
	for end := time.Now().Add(10 * time.Second); len(aMsgs) == 0 && time.Now().Before(end); {
		msgs, err := a.Fetch(t.Context(), 5, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		aMsgs = msgs
	}
	if len(aMsgs) == 0 {
		t.Fatal("member a fetched nothing")
	}
	_ = a.Close()
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < len(out) && time.Now().Before(deadline) {
		msgs, err := b.Fetch(t.Context(), 7, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			seen[m.Headers[sourcetest.IDHeader]]++
		}
		if err := b.Ack(t.Context(), msgs); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != len(out) {
		t.Fatalf("b saw %d distinct records of %d (a had fetched %d)", len(seen), len(out), len(aMsgs))
	}
}

func TestSASL(t *testing.T) {
	for _, mech := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		t.Run(mech, func(t *testing.T) {
			f := newFixture(t, 1, kfake.EnableSASL(), kfake.Superuser(mech, "idc", "s3cret"))
			sasl := &config.SASL{Mechanism: mech, UsernameEnv: "IDC_TEST_KAFKA_USER", PasswordEnv: "IDC_TEST_KAFKA_PASS"}
			if opts, err := brokerconn.KafkaOptions(f.cluster.ListenAddrs(), sasl, nil, nil, brokerconn.Kafka{}); err == nil || opts != nil {
				t.Fatal("the SASL options accepted unset environment variables")
			}
			t.Setenv("IDC_TEST_KAFKA_USER", "idc")
			t.Setenv("IDC_TEST_KAFKA_PASS", "s3cret")
			opts, err := brokerconn.KafkaOptions(f.cluster.ListenAddrs(), sasl, nil, nil, brokerconn.Kafka{})
			if err != nil {
				t.Fatal(err)
			}
			f.clientOpts = opts
			f.publish(t, []sourcetest.Outgoing{{ID: "a", Body: []byte("1")}})
			cfg := f.cfg()
			cfg.SASL = sasl
			s := newSource(t, cfg)
			defer s.Close()
			if err := s.Ack(t.Context(), fetchN(t, s, 1)); err != nil {
				t.Fatal(err)
			}
			t.Setenv("IDC_TEST_KAFKA_PASS", "wrong")
			if bad, err := New(t.Context(), cfg, testr.New(t)); err == nil {
				_ = bad.Close()
				t.Fatal("New succeeded with a wrong password")
			}
		})
	}
}

func TestNewFailsWithoutBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	cfg := &config.Kafka{BootstrapServers: []string{"127.0.0.1:1"}, Topics: []string{"t"}, ConsumerGroup: "g"}
	if s, err := New(ctx, cfg, testr.New(t)); err == nil {
		_ = s.Close()
		t.Fatal("New succeeded against a closed port")
	}
}
