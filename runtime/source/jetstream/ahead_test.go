package jetstream

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// A user's consumer whose MaxAckPending the replica fills: the request sent
// ahead is held by the server, and nats.go gives up on it after a second.
// Nothing may be stranded on the abandoned request (it would come back only
// after AckWait, 30 s): once acks free room, the next Fetch gets the very
// next messages at once.
func TestAheadHeldAtMaxAckPendingStrandsNothing(t *testing.T) {
	onServers(t, testAheadHeldAtMaxAckPendingStrandsNothing)
}

func testAheadHeldAtMaxAckPendingStrandsNothing(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	f.publishN(t, 60)
	if _, err := f.js.CreateConsumer(t.Context(), f.stream, jetstream.ConsumerConfig{
		Durable: "tight", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 20,
	}); err != nil {
		t.Fatal(err)
	}
	s, err := New(t.Context(), f.cfg("tight"), testr.New(t), WithDelivery(config.Delivery{BatchSize: 10, InFlight: 1, Replicas: 1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	a, errA := s.Fetch(t.Context(), 10, 200*time.Millisecond)
	b, errB := s.Fetch(t.Context(), 10, 200*time.Millisecond) // the batch ahead; the next request is held at 20 pending
	if errA != nil || errB != nil || len(a) != 10 || len(b) != 10 {
		t.Fatalf("first fetches: %d (%v), %d (%v); want 10 and 10", len(a), errA, len(b), errB)
	}
	// Wait until nats.go gave up on the request held ahead (its batch ends
	// with no message: one would mean it was not held at MaxAckPending) and
	// the server dropped it. nats.go closes the batch before it
	// unsubscribes the request's inbox: an ack sent in between frees room
	// while the server still holds the request, and the message it then
	// delivers to the dead inbox is stranded until AckWait whatever the
	// runtime does.
	if s.ahead == nil {
		t.Fatal("no request was sent ahead")
	}
	select {
	case m, ok := <-s.ahead.batch.Messages():
		if ok {
			t.Fatalf("the request held at MaxAckPending delivered %s", m.Subject())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nats.go never gave up on the request held ahead")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := f.js.Consumer(t.Context(), f.stream, "tight")
		if err != nil {
			t.Fatal(err)
		}
		if c.CachedInfo().NumWaiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server still holds %d pull requests 10 s after nats.go gave up", c.CachedInfo().NumWaiting)
		}
	}
	for _, batch := range [][]source.Message{a, b} {
		if err := s.Ack(t.Context(), batch); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	for time.Since(start) < 5*time.Second {
		msgs, err := s.Fetch(t.Context(), 10, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			continue
		}
		if want := fmt.Sprintf("%s:21", f.stream); msgs[0].NativeID != want || msgs[0].Attempt != 1 {
			t.Fatalf("next message %s (attempt %d), want %s first delivered: the held request stranded messages", msgs[0].NativeID, msgs[0].Attempt, want)
		}
		return
	}
	t.Fatalf("no message within 5 s after acks freed room at MaxAckPending")
}

// cutProxy forwards TCP to NATS until cut: then it closes every connection
// and refuses new ones until resumed.
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	cut   bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln}
	t.Cleanup(func() { _ = ln.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				_ = c.Close()
				continue
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				p.mu.Unlock()
				_ = c.Close()
				continue
			}
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.conns = nil
	}
}

// Acks made while NATS is unreachable are reported (the loop counts them in
// idc_ack_errors_total), and sent once the connection is back: the
// consumer then has nothing pending.
func TestAckWhileDisconnectedIsReportedAndSentOnReconnect(t *testing.T) {
	onServers(t, testAckWhileDisconnectedIsReportedAndSentOnReconnect)
}

func testAckWhileDisconnectedIsReportedAndSentOnReconnect(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	f.publishN(t, 10)
	p := newCutProxy(t, strings.TrimPrefix(f.url, "nats://"))
	cfg := f.cfg("cut")
	cfg.URL = "nats://" + p.ln.Addr().String()
	s, err := New(t.Context(), cfg, testr.New(t), WithDelivery(config.Delivery{BatchSize: 10, InFlight: 1, Replicas: 1}), WithReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	msgs, err := s.Fetch(t.Context(), 10, time.Second)
	if err != nil || len(msgs) != 10 {
		t.Fatalf("fetch: %d messages, %v", len(msgs), err)
	}
	p.setCut(true)
	deadline := time.Now().Add(5 * time.Second)
	for s.nc.IsConnected() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	err = s.Ack(t.Context(), msgs)
	if err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Fatalf("Ack while disconnected returned %v, want an error saying NATS is not connected", err)
	}
	p.setCut(false)
	c, err := f.js.Consumer(t.Context(), f.stream, "cut")
	if err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		info, err := c.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.AckFloor.Stream == 10 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after reconnecting: %d pending acknowledgement, ack floor %d; want the buffered acks sent (0, 10)", info.NumAckPending, info.AckFloor.Stream)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A Fetch asking for fewer messages than the batch requested ahead returns
// at most what it asked for; the batch ahead is given back, not lost.
func TestFetchSmallerThanTheBatchAheadKeepsItsLimit(t *testing.T) {
	onServers(t, testFetchSmallerThanTheBatchAheadKeepsItsLimit)
}

func testFetchSmallerThanTheBatchAheadKeepsItsLimit(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	f.publishN(t, 30)
	s, err := New(t.Context(), f.cfg("smaller"), testr.New(t), WithDelivery(config.Delivery{BatchSize: 10, InFlight: 1, Replicas: 1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	seen := map[string]bool{}
	for _, n := range []int{10, 5, 10, 10} {
		deadline := time.Now().Add(5 * time.Second)
		var msgs []source.Message
		for len(msgs) == 0 && time.Now().Before(deadline) {
			if msgs, err = s.Fetch(t.Context(), n, 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		if len(msgs) == 0 || len(msgs) > n {
			t.Fatalf("Fetch(%d) returned %d messages", n, len(msgs))
		}
		for _, m := range msgs {
			seen[m.NativeID] = true
		}
		if err := s.Ack(t.Context(), msgs); err != nil {
			t.Fatal(err)
		}
		if len(seen) == 30 {
			break
		}
	}
	if len(seen) < 30 {
		// The rest: whatever the given-back batch held comes again at once.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) && len(seen) < 30 {
			msgs, err := s.Fetch(t.Context(), 10, 200*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				seen[m.NativeID] = true
			}
			_ = s.Ack(t.Context(), msgs)
			if len(msgs) == 0 {
				break
			}
		}
	}
	if len(seen) != 30 {
		t.Fatalf("%d of 30 messages fetched: a given-back batch was lost", len(seen))
	}
}

// A Fetch that returned messages has already requested the next batch: it
// is delivered (pending acknowledgement) before the caller fetches again, and
// the next Fetch returns it. Every message comes once, in stream order.
func TestFetchRequestsTheNextBatchAhead(t *testing.T) {
	onServers(t, testFetchRequestsTheNextBatchAhead)
}

func testFetchRequestsTheNextBatchAhead(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	f.publishN(t, 25)
	s, err := New(t.Context(), f.cfg("ahead"), testr.New(t), WithDelivery(config.Delivery{BatchSize: 10, InFlight: 1, Replicas: 1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	var seqs []string
	fetch := func(want int) {
		t.Helper()
		msgs, err := s.Fetch(t.Context(), 10, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != want {
			t.Fatalf("fetched %d messages, want %d", len(msgs), want)
		}
		for _, m := range msgs {
			seqs = append(seqs, m.NativeID)
		}
	}
	fetch(10)
	// The server has delivered the batch ahead: 20 pending, none acked.
	c, err := f.js.Consumer(t.Context(), f.stream, "ahead")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, err := c.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after one Fetch of 10: %d messages pending acknowledgement, want 20 (the batch requested ahead)", info.NumAckPending)
		}
		time.Sleep(10 * time.Millisecond)
	}
	fetch(10)
	fetch(5)
	fetch(0) // caught up: waits maxWait, requests nothing ahead
	for i, id := range seqs {
		if want := fmt.Sprintf("%s:%d", f.stream, i+1); id != want {
			t.Fatalf("message %d is %s, want %s (every message once, in order): %v", i, id, want, seqs)
		}
	}
}

// Close gives back the batch requested ahead: another replica gets it at
// once, not after the consumer's AckWait (30 s).
func TestCloseGivesBackTheBatchAhead(t *testing.T) { onServers(t, testCloseGivesBackTheBatchAhead) }

func testCloseGivesBackTheBatchAhead(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	f.publishN(t, 20)
	d := config.Delivery{BatchSize: 10, InFlight: 1, Replicas: 1}
	a, err := New(t.Context(), f.cfg("handoff"), testr.New(t), WithDelivery(d))
	if err != nil {
		t.Fatal(err)
	}
	first, err := a.Fetch(t.Context(), 10, time.Second)
	if err != nil || len(first) != 10 {
		t.Fatalf("first fetch: %d messages, %v", len(first), err)
	}
	if err := a.Ack(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := New(t.Context(), f.cfg("handoff"), testr.New(t), WithDelivery(d))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	start := time.Now()
	var got []source.Message
	for len(got) < 10 && time.Since(start) < 5*time.Second {
		msgs, err := b.Fetch(t.Context(), 10, 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, msgs...)
	}
	if len(got) != 10 {
		t.Fatalf("the next replica got %d of the 10 messages the closed one had requested ahead within %s", len(got), time.Since(start).Round(time.Millisecond))
	}
	if got[0].NativeID != f.stream+":11" || got[0].Attempt != 2 {
		t.Errorf("first message %s attempt %d, want %s:11 redelivered (attempt 2)", got[0].NativeID, got[0].Attempt, f.stream)
	}
}
