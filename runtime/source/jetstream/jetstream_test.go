package jetstream

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
	"github.com/idempotency-dev/idc-operator/runtime/source/sourcetest"
)

// servers are the NATS servers every test here runs on, one subtest each
// (TestMain): the current nats-server, which the package starts itself, and
// the machine's Debian 2.9.10 on 127.0.0.1:4222, the oldest supported
// (IDC_TEST_NATS picks one of them). The tests fail (they do not skip) when
// one is down.
var servers []*natstest.Server

func TestMain(m *testing.M) {
	os.Exit(natstest.Main(m, natstest.Both, func(s []*natstest.Server) error {
		servers = s
		return nil
	}))
}

// onServers runs fn once per server, as subtests named by its version.
func onServers(t *testing.T, fn func(t *testing.T, srv *natstest.Server)) {
	natstest.Each(t, servers, fn)
}

type fixture struct {
	url     string
	js      jetstream.JetStream
	stream  string
	subject string
}

// newFixture creates a stream private to the test on srv and deletes it
// afterwards.
func newFixture(t *testing.T, srv *natstest.Server) *fixture {
	t.Helper()
	nc, err := nats.Connect(srv.URL)
	if err != nil {
		t.Fatalf("NATS %s at %s is required for this test: %v", srv.Version, srv.URL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := time.Now().UnixNano()
	f := &fixture{url: srv.URL, js: js, stream: fmt.Sprintf("IDC_TEST_%d", id), subject: fmt.Sprintf("idc.test.%d", id)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: f.stream, Subjects: []string{f.subject + ".>"}}); err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, f.stream); err != nil {
			t.Errorf("deleting stream %s: %v", f.stream, err)
		}
	})
	return f
}

func (f *fixture) publish(t *testing.T, msgs []sourcetest.Outgoing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, o := range msgs {
		m := nats.NewMsg(f.subject + ".orders")
		m.Header.Set(sourcetest.IDHeader, o.ID)
		m.Data = o.Body
		if _, err := f.js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
}

func (f *fixture) cfg(consumer string) *config.JetStream {
	return &config.JetStream{URL: f.url, Stream: f.stream, Consumer: consumer, FilterSubject: f.subject + ".>"}
}

func TestConformance(t *testing.T) { onServers(t, testConformance) }

func testConformance(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	const ackWait = time.Second
	// A user-made consumer with a short AckWait: New must bind to it as it
	// is, and the short AckWait makes redelivery fast.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := f.js.CreateConsumer(ctx, f.stream, jetstream.ConsumerConfig{
		Durable: "conformance", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: 7,
	}); err != nil {
		t.Fatal(err)
	}
	sourcetest.Run(t, sourcetest.Harness{
		NewSource: func(t *testing.T) source.Source {
			s, err := New(t.Context(), f.cfg("conformance"), testr.New(t))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return s
		},
		Publish:         f.publish,
		MaxWait:         300 * time.Millisecond,
		RedeliveryAfter: ackWait + time.Second,
		ReportsAttempts: true,
	})
	info, err := f.js.Consumer(ctx, f.stream, "conformance")
	if err != nil {
		t.Fatal(err)
	}
	if c := info.CachedInfo().Config; c.AckWait != ackWait || c.MaxDeliver != 7 {
		t.Errorf("existing consumer was changed: AckWait %v MaxDeliver %d", c.AckWait, c.MaxDeliver)
	}
}

func TestNewCreatesMissingConsumer(t *testing.T) { onServers(t, testNewCreatesMissingConsumer) }

func testNewCreatesMissingConsumer(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	s, err := New(t.Context(), f.cfg("created"), testr.New(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, err := f.js.Consumer(ctx, f.stream, "created")
	if err != nil {
		t.Fatalf("consumer was not created: %v", err)
	}
	cfg := c.CachedInfo().Config
	if cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.FilterSubject != f.subject+".>" || cfg.Durable != "created" {
		t.Fatalf("unexpected consumer config: %+v", cfg)
	}
	f.publish(t, []sourcetest.Outgoing{{ID: "one", Body: []byte("x")}})
	msgs, err := s.Fetch(ctx, 5, time.Second)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("Fetch: %d messages, %v", len(msgs), err)
	}
	if want := f.stream + ":1"; msgs[0].NativeID != want {
		t.Errorf("NativeID %q, want %q", msgs[0].NativeID, want)
	}
	if err := s.Ack(ctx, msgs); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	// A second New binds to the consumer it created before.
	s2, err := New(t.Context(), f.cfg("created"), testr.New(t))
	if err != nil {
		t.Fatalf("second New: %v", err)
	}
	_ = s2.Close()
}

func TestNewRejectsAckNoneConsumer(t *testing.T) { onServers(t, testNewRejectsAckNoneConsumer) }

func testNewRejectsAckNoneConsumer(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := f.js.CreateConsumer(ctx, f.stream, jetstream.ConsumerConfig{Durable: "noack", AckPolicy: jetstream.AckNonePolicy}); err != nil {
		t.Fatal(err)
	}
	if s, err := New(ctx, f.cfg("noack"), testr.New(t)); err == nil {
		_ = s.Close()
		t.Fatal("New accepted a consumer with AckPolicy none")
	}
}

func TestNewFailsWithoutServer(t *testing.T) {
	cfg := &config.JetStream{URL: "nats://127.0.0.1:1", Stream: "S", Consumer: "c"}
	if s, err := New(t.Context(), cfg, testr.New(t)); err == nil {
		_ = s.Close()
		t.Fatal("New succeeded against a closed port")
	}
}

func TestEmptyCredentialsEnvIsAnError(t *testing.T) {
	t.Setenv("IDC_TEST_NATS_CREDS", "")
	cfg := &config.JetStream{URL: servers[0].URL, Stream: "S", Consumer: "c", CredentialsEnv: "IDC_TEST_NATS_CREDS"}
	if s, err := New(t.Context(), cfg, testr.New(t)); err == nil {
		_ = s.Close()
		t.Fatal("New accepted an empty credentials variable")
	}
}
