package retention

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

func TestPartitionFilter(t *testing.T) {
	stream := func(subjects []string, src, dest string) jetstream.StreamConfig {
		st := jetstream.StreamConfig{Name: "ORDERS", Subjects: subjects}
		if dest != "" {
			st.SubjectTransform = &jetstream.SubjectTransformConfig{Source: src, Destination: dest}
		}
		return st
	}
	for _, tc := range []struct {
		name    string
		st      jetstream.StreamConfig
		n, i    int
		want    string
		wantErr []string
	}{
		{name: "the documented mapping", st: stream([]string{"orders.*"}, "orders.*", "orders.{{partition(4,1)}}.{{wildcard(1)}}"), n: 4, i: 0, want: "orders.0.*"},
		{name: "last partition", st: stream([]string{"orders.*"}, "orders.*", "orders.{{partition(4,1)}}.{{wildcard(1)}}"), n: 4, i: 3, want: "orders.3.*"},
		{name: "spaces and case as nats-server allows", st: stream(nil, "orders.*", "orders.{{ Partition( 4 , 1 ) }}.{{ Wildcard( 1 ) }}"), n: 4, i: 2, want: "orders.2.*"},
		{name: "legacy $k and literals kept", st: stream(nil, "a.*.*.b", "p.{{partition(8,1,2)}}.$2.x.$1"), n: 8, i: 7, want: "p.7.*.x.*"},
		{name: "partition first", st: stream(nil, "orders.*", "{{partition(3,1)}}.orders.{{wildcard(1)}}"), n: 3, i: 1, want: "1.orders.*"},
		{name: "partition over the whole subject", st: stream(nil, "orders.*", "orders.{{partition(2)}}.{{wildcard(1)}}"), n: 2, i: 1, want: "orders.1.*"},
		{name: "no transform", st: stream([]string{"orders.*"}, "", ""), n: 4, i: 0,
			wantErr: []string{"stream ORDERS has no subject transform", "partitions: 4", "nats stream edit ORDERS --transform-source 'orders.*' --transform-destination 'orders.{{partition(4,1)}}.{{wildcard(1)}}'"}},
		{name: "no transform, two wildcards", st: stream([]string{"orders.*.created.*"}, "", ""), n: 2, i: 0,
			wantErr: []string{"--transform-source 'orders.*.created.*' --transform-destination 'orders.{{partition(2,1,2)}}.{{wildcard(1)}}.created.{{wildcard(2)}}'"}},
		{name: "no transform, a subject ending in >", st: stream([]string{"orders.>"}, "", ""), n: 2, i: 0,
			wantErr: []string{"--transform-source 'orders.*' --transform-destination 'orders.{{partition(2,1)}}.{{wildcard(1)}}'"}},
		{name: "no transform, a literal subject", st: stream([]string{"orders"}, "", ""), n: 2, i: 0,
			wantErr: []string{"--transform-source 'orders.*' --transform-destination 'orders.{{partition(2,1)}}.{{wildcard(1)}}'"}},
		{name: "a transform that does not partition", st: stream([]string{"orders.*"}, "orders.*", "o.{{wildcard(1)}}"), n: 4, i: 0,
			wantErr: []string{"orders.* → o.{{wildcard(1)}}, which does not partition", "--transform-destination"}},
		{name: "another number of partitions", st: stream(nil, "orders.*", "orders.{{partition(8,1)}}.{{wildcard(1)}}"), n: 4, i: 0,
			wantErr: []string{"into 8", "partitions is 4", "set partitions to 8"}},
		{name: "another mapping function", st: stream(nil, "orders.*", "orders.{{partition(4,1)}}.{{split(1,-)}}"), n: 4, i: 0,
			wantErr: []string{"uses {{split(1,-)}}"}},
		{name: "two partition tokens", st: stream(nil, "orders.*", "{{partition(4,1)}}.{{partition(4,1)}}.{{wildcard(1)}}"), n: 4, i: 0,
			wantErr: []string{"holds 2 {{partition(...)}} tokens"}},
		{name: "partition inside a token", st: stream(nil, "orders.*", "orders.p{{partition(4,1)}}.{{wildcard(1)}}"), n: 4, i: 0,
			wantErr: []string{"holds 0 {{partition(...)}} tokens"}},
		{name: "partition out of range", st: stream(nil, "orders.*", "orders.{{partition(4,1)}}.{{wildcard(1)}}"), n: 4, i: 4,
			wantErr: []string{"partition 4 of 4 does not exist (partitions are 0..3)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PartitionFilter(tc.st, tc.n, tc.i)
			if tc.wantErr == nil {
				if err != nil || got != tc.want {
					t.Fatalf("PartitionFilter = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("PartitionFilter = %q, want an error", got)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestPartitionsSupported(t *testing.T) {
	for v, ok := range map[string]bool{"2.9.10": false, "2.9.25": false, "1.4.0": false, "2.10.0": true, "2.15.3": true, "3.0.0": true, "": true, "dev": true} {
		err := PartitionsSupported(v)
		if ok != (err == nil) {
			t.Errorf("PartitionsSupported(%q) = %v", v, err)
		}
		if err != nil && !strings.Contains(err.Error(), "partitions needs nats-server 2.10 or later (this server is "+v+")") {
			t.Errorf("PartitionsSupported(%q) = %v", v, err)
		}
	}
}

// BoundByReadings judges each silent replica by the reading of its own
// consumer: one partition's settled durable retires its replica while
// another's unsettled one holds.
func TestBoundByReadingsPerConsumer(t *testing.T) {
	now := time.Now()
	created := now.Add(-time.Hour)
	rec := func(replica, durable string) inbox.ProgressRecord {
		return inbox.ProgressRecord{Replica: replica, StartedAt: created, HeartbeatAt: now.Add(-2 * StaleAfter),
			Positions: map[string]int64{"stream": 10},
			Consumer:  &inbox.ConsumerIdentity{Kind: "NATSJetStream", Name: "S/" + durable, Created: &created}}
	}
	reading := func(durable string, unsettled int64) Settlement {
		return Settlement{Unsettled: unsettled, Position: map[string]int64{"stream": 20}, Floor: map[string]int64{"stream": 5},
			Monotonic: []string{"stream"}, Consumer: inbox.ConsumerIdentity{Kind: "NATSJetStream", Name: "S/" + durable, Created: &created}}
	}
	readings := map[string]Settlement{"S/idc-p0": reading("idc-p0", 0), "S/idc-p1": reading("idc-p1", 3)}
	recs := []inbox.ProgressRecord{rec("a", "idc-p0"), rec("b", "idc-p1")}
	h := BoundByReadings(now, time.Hour, recs, func(r inbox.ProgressRecord) (Settlement, error) {
		return readings[r.Consumer.Name], nil
	})
	if len(h.Retire) != 1 || h.Retire[0].Replica != "a" {
		t.Errorf("retired %+v, want replica a (its partition settled)", h.Retire)
	}
	if len(h.Stamp) != 1 || h.Stamp[0].Replica != "b" || h.Marks["b"]["stream"] != 20 {
		t.Errorf("stamped %+v marks %v, want replica b at its partition's position 20", h.Stamp, h.Marks)
	}
	// One reading for everyone (BoundByProgress) would have judged b by
	// a's settled consumer: the other consumer's reading.
	one := BoundByProgress(now, time.Hour, recs, readings["S/idc-p0"], nil)
	if len(one.Retire) != 1 || one.Retire[0].Replica != "a" {
		t.Errorf("one reading: retired %+v", one.Retire)
	}
	if len(one.Stamp) != 1 || one.Stamp[0].Replica != "b" || !strings.Contains(one.Evidence["b"], "not of the") {
		t.Errorf("one reading: b stamped %+v evidence %q, want it held as another consumer's reading", one.Stamp, one.Evidence["b"])
	}
}
