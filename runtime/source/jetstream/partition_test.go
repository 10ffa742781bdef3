package jetstream

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// partitionedFixture is a stream on subjects <subject>.* that the server
// partitions into n (orders.<k> stored as orders.<p>.<k>); on a server
// without subject transforms (2.9) it is created without one.
func partitionedFixture(t *testing.T, srv *natstest.Server, n int) *fixture {
	t.Helper()
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := time.Now().UnixNano()
	f := &fixture{url: srv.URL, js: js, stream: fmt.Sprintf("IDC_PART_%d", id), subject: fmt.Sprintf("idc.part.%d", id)}
	st := jetstream.StreamConfig{Name: f.stream, Subjects: []string{f.subject + ".*"}}
	if retention.PartitionsSupported(srv.Version) == nil {
		st.SubjectTransform = &jetstream.SubjectTransformConfig{Source: f.subject + ".*",
			Destination: fmt.Sprintf("%s.{{partition(%d,1)}}.{{wildcard(1)}}", f.subject, n)}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, st); err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, f.stream)
	})
	return f
}

func (f *fixture) partitioned(n int) config.JetStream {
	return config.JetStream{URL: f.url, Stream: f.stream, Consumer: "idc", Partitions: n}
}

// Each partition's durable reads its partition's subjects only, and the
// partitions together read every message once.
func TestPartitionsSplitTheStream(t *testing.T) { onServers(t, testPartitionsSplitTheStream) }

func testPartitionsSplitTheStream(t *testing.T, srv *natstest.Server) {
	const n, keys = 4, 40
	f := partitionedFixture(t, srv, n)
	if err := retention.PartitionsSupported(srv.Version); err != nil {
		_, err := New(t.Context(), ptr(f.partitioned(n).ForPartition(0)), testr.New(t))
		if err == nil || !strings.Contains(err.Error(), "partitions needs nats-server 2.10 or later (this server is "+srv.Version+")") {
			t.Fatalf("New on nats-server %s: %v, want the version error", srv.Version, err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for k := range keys {
		m := nats.NewMsg(fmt.Sprintf("%s.k%d", f.subject, k))
		m.Data = []byte(fmt.Sprint(k))
		if _, err := f.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	for i := range n {
		cfg := f.partitioned(n).ForPartition(i)
		s, err := New(ctx, &cfg, testr.New(t))
		if err != nil {
			t.Fatalf("partition %d: %v", i, err)
		}
		c, err := f.js.Consumer(ctx, f.stream, fmt.Sprintf("idc-p%d", i))
		if err != nil {
			t.Fatalf("partition %d's durable idc-p%d: %v", i, i, err)
		}
		if got, want := c.CachedInfo().Config.FilterSubject, fmt.Sprintf("%s.%d.*", f.subject, i); got != want {
			t.Errorf("partition %d's filter %q, want %q", i, got, want)
		}
		for {
			msgs, err := s.Fetch(ctx, keys, 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) == 0 {
				break
			}
			for _, m := range msgs {
				seen[string(m.Body)]++
				if p := m.Ref.(jetstream.Msg).Subject(); !strings.HasPrefix(p, fmt.Sprintf("%s.%d.", f.subject, i)) {
					t.Errorf("partition %d got %s", i, p)
				}
			}
			if err := s.Ack(ctx, msgs); err != nil {
				t.Fatal(err)
			}
		}
		_ = s.Close()
		// Binding again uses the durable it created.
		s, err = New(ctx, &cfg, testr.New(t))
		if err != nil {
			t.Fatalf("partition %d, again: %v", i, err)
		}
		_ = s.Close()
	}
	if len(seen) != keys {
		t.Errorf("the partitions read %d distinct messages of %d", len(seen), keys)
	}
	for k, c := range seen {
		if c != 1 {
			t.Errorf("message %s read %d times", k, c)
		}
	}
}

func TestPartitionBindRefuses(t *testing.T) { onServers(t, testPartitionBindRefuses) }

func testPartitionBindRefuses(t *testing.T, srv *natstest.Server) {
	f := partitionedFixture(t, srv, 4)
	whole := f.partitioned(4)
	if _, err := New(t.Context(), &whole, testr.New(t)); err == nil || !strings.Contains(err.Error(), "--partition=<0..3>") {
		t.Errorf("a partitioned config without a partition: %v", err)
	}
	if retention.PartitionsSupported(srv.Version) != nil {
		return // the version error: TestPartitionsSplitTheStream
	}
	other := f.partitioned(2).ForPartition(0)
	if _, err := New(t.Context(), &other, testr.New(t)); err == nil || !strings.Contains(err.Error(), "into 4") || !strings.Contains(err.Error(), "partitions is 2") {
		t.Errorf("2 partitions of a stream partitioned into 4: %v", err)
	}
	// A durable of the partition's name reading other subjects is refused.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := f.js.CreateConsumer(ctx, f.stream, jetstream.ConsumerConfig{Durable: "idc-p1", AckPolicy: jetstream.AckExplicitPolicy,
		FilterSubject: f.subject + ".2.*"}); err != nil {
		t.Fatal(err)
	}
	p1 := whole.ForPartition(1)
	if _, err := New(t.Context(), &p1, testr.New(t)); err == nil || !strings.Contains(err.Error(), "is filtered to "+f.subject+".2.*") ||
		!strings.Contains(err.Error(), "partition 1 of 4 reads "+f.subject+".1.*") {
		t.Errorf("a partition durable with another partition's filter: %v", err)
	}
	// A stream without a partitioning transform.
	plain := newFixture(t, srv)
	cfg := config.JetStream{URL: f.url, Stream: plain.stream, Consumer: "idc", Partitions: 4}.ForPartition(0)
	if _, err := New(t.Context(), &cfg, testr.New(t)); err == nil || !strings.Contains(err.Error(), "no subject transform") ||
		!strings.Contains(err.Error(), "nats stream edit "+plain.stream+" --transform-source") {
		t.Errorf("a stream without a transform: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }
