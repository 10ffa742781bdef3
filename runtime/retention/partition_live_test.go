package retention

// Partitioned JetStream readings on a real nats-server: 2.15.3 (started by
// the test: the package's other tests run on the machine's server) and the
// machine's 2.9.10, which has no subject transforms.

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// currentNATS starts the current nats-server for one test.
func currentNATS(t *testing.T) (string, jetstream.JetStream) {
	t.Helper()
	srv, err := natstest.StartCurrent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	return srv.URL, jsAt(t, srv.URL)
}

func jsAt(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// partitionedStream creates stream name on <name>.* partitioned into n by
// its subject transform (none when n is 0).
func partitionedStream(t *testing.T, js jetstream.JetStream, name string, n int) string {
	t.Helper()
	subject := strings.ToLower(name)
	st := jetstream.StreamConfig{Name: name, Subjects: []string{subject + ".*"}, MaxAge: 48 * time.Hour}
	if n > 0 {
		st.SubjectTransform = &jetstream.SubjectTransformConfig{Source: subject + ".*",
			Destination: fmt.Sprintf("%s.{{partition(%d,1)}}.{{wildcard(1)}}", subject, n)}
	}
	if _, err := js.CreateStream(testCtx(t), st); err != nil {
		t.Fatalf("creating stream %s: %v", name, err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(testCtx(t), name) })
	return subject
}

func partitionedConfig(url, stream string, n int) *config.Config {
	return baseConfig(config.Source{NATSJetStream: &config.JetStream{URL: url, Stream: stream, Consumer: "idc", Partitions: n}},
		retention(24*time.Hour, time.Hour, 0))
}

func TestReadPartitionedJetStream(t *testing.T) {
	url, js := currentNATS(t)
	const n = 4
	name := strings.ToUpper(unique("IDC_PART"))
	subject := partitionedStream(t, js, name, n)
	for k := range 40 {
		if _, err := js.Publish(testCtx(t), fmt.Sprintf("%s.k%d", subject, k), nil); err != nil {
			t.Fatal(err)
		}
	}
	// Partitions 0 and 2 exist; 0 with limits of its own (the window's).
	create := func(i int, ackWait time.Duration, maxDeliver int) {
		t.Helper()
		if _, err := js.CreateConsumer(testCtx(t), name, jetstream.ConsumerConfig{
			Durable: config.PartitionConsumer("idc", i), AckPolicy: jetstream.AckExplicitPolicy,
			AckWait: ackWait, MaxDeliver: maxDeliver, MaxAckPending: 77,
			FilterSubject: fmt.Sprintf("%s.%d.*", subject, i),
		}); err != nil {
			t.Fatal(err)
		}
	}
	create(0, 30*time.Second, 5)
	create(2, time.Hour, 100)
	cfg := partitionedConfig(url, name, n)
	r, dials, err := readCounting(t, cfg, nil)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	// The window of TestReadJetStream: partition 0's limits (30s x 5), not
	// partition 2's.
	if r.Result.Window != 49*time.Hour || r.Result.Limits.MaxAckPending != 77 || !strings.Contains(r.Result.DerivedFrom, "consumer idc-p0 (partition 0 of 4") {
		t.Errorf("window %s limits %+v derivedFrom %s", r.Result.Window, r.Result.Limits, r.Result.DerivedFrom)
	}
	if dials != 1 {
		t.Errorf("Read dialled %d times", dials)
	}
	if !errors.Is(r.LagErr, ErrSourceNotFound) || !strings.Contains(r.LagErr.Error(), "idc-p1") || !strings.Contains(r.LagErr.Error(), "idc-p3") {
		t.Errorf("lag error %v, want ErrSourceNotFound naming idc-p1 and idc-p3", r.LagErr)
	}
	want := func(parts []PartitionLag, missing ...int) int64 {
		t.Helper()
		var sum int64
		if len(parts) != n {
			t.Fatalf("partitions %+v", parts)
		}
		for i, p := range parts {
			gone := false
			for _, m := range missing {
				gone = gone || m == i
			}
			if p.Index != i || p.Consumer != config.PartitionConsumer("idc", i) || gone != errors.Is(p.Err, ErrSourceNotFound) || (!gone && p.Err != nil) {
				t.Errorf("partition %d: %+v", i, p)
			}
			sum += p.Lag
		}
		return sum
	}
	if sum := want(r.Partitions, 1, 3); r.Lag != sum || sum == 0 || sum >= 40 {
		t.Errorf("lag %d, partitions sum to %d (of 40 messages, two partitions read)", r.Lag, sum)
	}
	create(1, 30*time.Second, 5)
	create(3, 30*time.Second, 5)
	r, _, err = readCounting(t, cfg, nil)
	if err != nil || r.LagErr != nil || r.Lag != 40 || want(r.Partitions) != 40 {
		t.Errorf("every partition's durable: lag %d (%v), err %v, partitions %+v", r.Lag, r.LagErr, err, r.Partitions)
	}
	// Explicit mode reads the lag alone, over every partition.
	cfg.Retention = config.Retention{Mode: ModeExplicit, Window: config.Duration{Duration: time.Hour}}
	r, _, err = readCounting(t, cfg, nil)
	if err != nil || r.LagErr != nil || r.Lag != 40 || len(r.Partitions) != n {
		t.Errorf("explicit: lag %d (%v), err %v, partitions %+v", r.Lag, r.LagErr, err, r.Partitions)
	}
	if lag, err := Lag(testCtx(t), partitionedConfig(url, name, n), nil); err != nil || lag != 40 {
		t.Errorf("Lag = %d, %v", lag, err)
	}
	// One partition's view reads its durable alone; a whole partitioned
	// config is never settled as one consumer.
	one := partitionedConfig(url, name, n)
	view := one.Source.NATSJetStream.ForPartition(2)
	one.Source.NATSJetStream = &view
	if st, err := Settle(testCtx(t), one, nil); err != nil || st.Consumer.Name != name+"/idc-p2" {
		t.Errorf("Settle of partition 2: %+v, %v", st, err)
	}
	if _, err := Settle(testCtx(t), partitionedConfig(url, name, n), nil); err == nil || !strings.Contains(err.Error(), "one partition's") {
		t.Errorf("Settle of the whole partitioned config: %v", err)
	}
}

// A stream not partitioned as configured: Read fails with ErrSourceNotFound
// saying what to change, its lag too.
func TestReadPartitionedJetStreamMismatch(t *testing.T) {
	url, js := currentNATS(t)
	for _, tc := range []struct {
		streamPartitions int
		want             []string
	}{
		{0, []string{"has no subject transform", "--transform-source", "{{partition(4,1)}}"}},
		{8, []string{"into 8", "partitions is 4"}},
	} {
		name := strings.ToUpper(unique("IDC_PART"))
		partitionedStream(t, js, name, tc.streamPartitions)
		for _, mode := range []string{ModeDerived, ModeExplicit} {
			cfg := partitionedConfig(url, name, 4)
			if mode == ModeExplicit {
				cfg.Retention = config.Retention{Mode: ModeExplicit, Window: config.Duration{Duration: time.Hour}}
			}
			r, err := Read(testCtx(t), cfg, nil, time.Now())
			check := r.LagErr
			if mode == ModeDerived {
				check = err
			}
			if !errors.Is(check, ErrSourceNotFound) || !errors.Is(check, ErrNotPartitioned) {
				t.Errorf("%s, stream in %d: %v (lag %v), want ErrSourceNotFound and ErrNotPartitioned", mode, tc.streamPartitions, err, r.LagErr)
				continue
			}
			for _, w := range tc.want {
				if !strings.Contains(check.Error(), w) {
					t.Errorf("%s, stream in %d: %q does not say %q", mode, tc.streamPartitions, check, w)
				}
			}
		}
	}
}

// The machine's nats-server 2.9.10 has no subject transforms.
func TestReadPartitionedJetStreamOldServer(t *testing.T) {
	srv, err := natstest.OpenSystem()
	if err != nil {
		t.Fatal(err)
	}
	if PartitionsSupported(srv.Version) == nil {
		t.Fatalf("the machine's nats-server is %s; this test needs one older than 2.10", srv.Version)
	}
	js := jsAt(t, srv.URL)
	name := strings.ToUpper(unique("IDC_PART"))
	partitionedStream(t, js, name, 0)
	_, err = Read(testCtx(t), partitionedConfig(srv.URL, name, 4), nil, time.Now())
	want := "partitions needs nats-server 2.10 or later (this server is " + srv.Version + ")"
	if !errors.Is(err, ErrSourceNotFound) || !strings.Contains(err.Error(), want) {
		t.Errorf("Read on %s: %v, want %q", srv.Version, err, want)
	}
}
