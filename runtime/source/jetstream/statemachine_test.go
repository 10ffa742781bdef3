package jetstream

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// fakeConsumer is the server side of the state machine's tests: every pull
// request it is sent is a silentRequest the test delivers on, ends, or
// leaves silent (a 2.9 server that dropped it without a status).
type fakeConsumer struct {
	jetstream.Consumer // only FetchNoWait and Fetch are called
	mu                 sync.Mutex
	sent               []*silentRequest
}

func (c *fakeConsumer) FetchNoWait(int) (jetstream.MessageBatch, error) { return c.send(), nil }

func (c *fakeConsumer) Fetch(int, ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	return c.send(), nil
}

func (c *fakeConsumer) send() *silentRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := newSilentRequest()
	c.sent = append(c.sent, r)
	return r
}

// fakeMsg is a delivered message; it counts the NAKs it gets.
type fakeMsg struct {
	jetstream.Msg // only what convertMeta, Ack and Nak call
	seq, pending  uint64
	naks          *atomic.Int64
}

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Stream: "FAKE", Sequence: jetstream.SequencePair{Stream: m.seq},
		NumPending: m.pending, NumDelivered: 1, Timestamp: time.Unix(0, 0)}, nil
}
func (m *fakeMsg) Headers() nats.Header { return nil }
func (m *fakeMsg) Data() []byte         { return nil }
func (m *fakeMsg) Ack() error           { return nil }
func (m *fakeMsg) Reply() string        { return "" }
func (m *fakeMsg) Nak() error           { m.naks.Add(1); return nil }

// machine is a Source on a fakeConsumer with the 2.9 workaround on: a
// waiting request is given up past its until. The grace is an hour, so only
// a request a row makes expired is given up, never one the Source sent
// while the row ran (the rows hold no race against a clock).
type machine struct {
	t    *testing.T
	s    *Source
	fc   *fakeConsumer
	seq  uint64
	naks atomic.Int64
}

func newMachine(t *testing.T, fixed bool) *machine {
	fc := &fakeConsumer{}
	tm := Timing{ExpiryGrace: time.Hour, FillGap: defaultFillGap, NoWaitStall: defaultNoWaitStall}
	m := &machine{t: t, fc: fc, s: newSource(testr.New(t), fc, options{fixed: fixed, timing: &tm})}
	t.Cleanup(func() {
		_ = m.s.Close()
		if n := m.s.invalidMoves.Load(); n > 0 {
			t.Errorf("%d invalid pull request transitions", n)
		}
	})
	return m
}

// deliver puts n messages on r; the last says pending are left behind it.
func (m *machine) deliver(r *silentRequest, n int, pending uint64) {
	for i := range n {
		m.seq++
		p := uint64(0)
		if i == n-1 {
			p = pending
		}
		r.msgs <- &fakeMsg{seq: m.seq, pending: p, naks: &m.naks}
	}
}

// request is a pull request in state st on a new silent batch, installed
// where the Source keeps requests in that state.
func (m *machine) request(st reqState, n int, until time.Time) (*pullRequest, *silentRequest) {
	b := newSilentRequest()
	r := newRequest(b, n, st, until)
	switch st {
	case reqSent, reqOpen:
		m.s.ahead = r
	case reqLate:
		m.s.late = r
	case reqRetired:
		r.state = reqLate
		m.s.drain(r)
	}
	return r, b
}

func (m *machine) fetch(maxN int, maxWait time.Duration) []source.Message {
	m.t.Helper()
	msgs, err := m.s.Fetch(context.Background(), maxN, maxWait)
	if err != nil {
		m.t.Fatal(err)
	}
	return msgs
}

var expired = time.Now().Add(-time.Hour)

// transitionCase is one move of a pull request: from is how the row sets
// the request up, act what the Source does to it, to where it must end.
type transitionCase struct {
	name     string
	fixed    bool
	from, to reqState
	until    time.Time
	act      func(t *testing.T, m *machine, r *pullRequest, b *silentRequest)
}

var transitionCases = []transitionCase{
	{name: "a no-wait request part taken stays open", from: reqSent, to: reqOpen,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			m.deliver(b, 2, 0) // 2 of 10, nothing pending behind them
			if got := m.fetch(10, never); len(got) != 2 {
				t.Fatalf("fetched %d, want 2", len(got))
			}
			if m.s.ahead != r {
				t.Error("the open request is not kept ahead for the next Fetch")
			}
		}},
	{name: "batching Fixed: a no-wait request quiet for noWaitStall stays open", fixed: true, from: reqSent, to: reqOpen,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			m.deliver(b, 1, 0)
			if got := m.fetch(10, never); len(got) != 1 {
				t.Fatalf("fetched %d, want 1", len(got))
			}
		}},
	{name: "a no-wait request taken whole ends", from: reqSent, to: reqEnded,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			m.deliver(b, 10, 0)
			if got := m.fetch(10, never); len(got) != 10 {
				t.Fatalf("fetched %d, want 10", len(got))
			}
			if m.s.ahead == nil || m.s.ahead == r {
				t.Error("no new request was sent ahead")
			}
		}},
	{name: "batching Fixed: a no-wait request whose batch ends, ends", fixed: true, from: reqSent, to: reqEnded,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			m.deliver(b, 3, 0)
			close(b.msgs)
			if got := m.fetch(10, never); len(got) != 3 {
				t.Fatalf("fetched %d, want 3", len(got))
			}
		}},
	{name: "batching Fixed: a long poll silent past its expiry is given up", fixed: true, from: reqSent, to: reqLate, until: expired,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			if got, err := m.s.collectAll(context.Background(), r, 10); err != nil || len(got) != 0 {
				t.Fatalf("collectAll: %d messages, %v", len(got), err)
			}
			m.s.ahead = nil // as longPoll does
			if m.s.late != r {
				t.Error("the given-up request is not the late one")
			}
		}},
	{name: "a cancelled Fetch ends the request", from: reqOpen, to: reqEnded,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, _, err := m.s.take(ctx, r, 10, nil, 0); err == nil {
				t.Fatal("take with a cancelled context returned no error")
			}
		}},
	{name: "an open request whose batch ends, ends", from: reqOpen, to: reqEnded,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			close(b.msgs)
			_ = m.fetch(10, 10*time.Millisecond)
			if m.s.ahead == r {
				t.Error("the ended request is still ahead")
			}
		}},
	{name: "an open request given back on Close", from: reqOpen, to: reqEnded,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			m.deliver(b, 2, 0)
			if err := m.s.Close(); err != nil {
				t.Fatal(err)
			}
			if n := m.naks.Load(); n != 2 {
				t.Errorf("Close gave back %d messages, want 2", n)
			}
		}},
	{name: "an open waiting request silent past its expiry is given up", from: reqOpen, to: reqLate, until: expired,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			_ = m.fetch(10, 10*time.Millisecond)
			if m.s.late != r {
				t.Error("the given-up request is not the late one")
			}
		}},
	{name: "a late request's delivery is taken, and its end drops it", from: reqLate, to: reqEnded,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			m.deliver(b, 1, 0)
			if got := m.fetch(10, never); len(got) != 1 {
				t.Fatalf("fetched %d, want the late message", len(got))
			}
			if r.state != reqLate {
				t.Fatalf("a late request that delivered is %s before it ended, want late", r.state)
			}
			close(b.msgs)
			_ = m.fetch(10, 10*time.Millisecond)
			if m.s.late != nil {
				t.Error("the ended late request is kept")
			}
		}},
	{name: "a late request given back on Close", from: reqLate, to: reqEnded,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			m.deliver(b, 2, 0)
			if err := m.s.Close(); err != nil {
				t.Fatal(err)
			}
			if n := m.naks.Load(); n != 2 {
				t.Errorf("Close gave back %d messages, want 2", n)
			}
		}},
	{name: "a late request replaced by a newer late one is retired and drained", from: reqLate, to: reqRetired,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			m.s.ahead = newRequest(newSilentRequest(), 10, reqOpen, expired)
			_ = m.fetch(10, 10*time.Millisecond)
			if m.s.late == r || m.s.late == nil {
				t.Fatal("the newer given-up request is not the late one")
			}
			if got := m.s.retiredCount(); got != 1 {
				t.Fatalf("%d retired requests, want 1", got)
			}
			m.deliver(b, 3, 0) // delivered after it was retired: given back
			waitFor(t, func() bool { return m.naks.Load() == 3 }, "the drain gave back %d of 3", func() any { return m.naks.Load() })
		}},
	{name: "a retired request's drain ends with its batch", from: reqRetired, to: reqEnded,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			m.deliver(b, 1, 0)
			close(b.msgs)
			waitFor(t, func() bool { return m.s.retiredCount() == 0 }, "%d retired requests after the batch ended", func() any { return m.s.retiredCount() })
			if n := m.naks.Load(); n != 1 {
				t.Errorf("the drain gave back %d messages, want 1", n)
			}
		}},
	{name: "a retired request's drain is stopped by Close", from: reqRetired, to: reqEnded,
		act: func(t *testing.T, m *machine, r *pullRequest, b *silentRequest) {
			if err := m.s.Close(); err != nil { // b never ends: Close stops the drain
				t.Fatal(err)
			}
			if got := m.s.retiredCount(); got != 0 {
				t.Errorf("%d retired requests after Close", got)
			}
		}},
}

// Every transition the state machine allows, one row at least each, on the
// fake server: the row's request must end where the row says, with no move
// the machine forbids.
func TestPullRequestTransitions(t *testing.T) {
	covered := map[[2]reqState]bool{}
	for _, tc := range transitionCases {
		covered[[2]reqState{tc.from, tc.to}] = true
		t.Run(fmt.Sprintf("%s to %s: %s", tc.from, tc.to, tc.name), func(t *testing.T) {
			m := newMachine(t, tc.fixed)
			r, b := m.request(tc.from, 10, tc.until)
			tc.act(t, m, r, b)
			if tc.to == reqEnded && r.state == reqRetired {
				// A drain ends on its own goroutine.
				waitFor(t, func() bool { return m.s.retiredCount() == 0 }, "%d retired", func() any { return m.s.retiredCount() })
			}
			m.s.retiredMu.Lock()
			got := r.state
			m.s.retiredMu.Unlock()
			if got != tc.to {
				t.Errorf("the request is %s, want %s", got, tc.to)
			}
			if n := m.s.invalidMoves.Load(); n > 0 {
				t.Errorf("%d invalid transitions", n)
			}
		})
	}
	for from, tos := range transitions {
		for _, to := range tos {
			if !covered[[2]reqState{from, to}] {
				t.Errorf("no test row for the transition %s -> %s", from, to)
			}
		}
	}
}

// A move the table does not allow is reported, not made silently.
func TestInvalidTransitionIsCounted(t *testing.T) {
	m := newMachine(t, false)
	r, _ := m.request(reqSent, 10, time.Time{})
	m.s.move(r, reqRetired)
	if n := m.s.invalidMoves.Swap(0); n != 1 {
		t.Fatalf("sent -> retired counted %d times, want 1", n)
	}
}

// Close waits for every drain it started: no goroutine of the adapter
// outlives it, even when a given-up request never ends (a silent server;
// nats.go's own goroutine for it is not there in the fake).
func TestCloseLeavesNoDrainRunning(t *testing.T) {
	before := goleak.IgnoreCurrent()
	m := newMachine(t, false)
	for range 3 { // three requests given up in turn: two retired, one late
		m.s.ahead = newRequest(newSilentRequest(), 10, reqOpen, expired)
		_ = m.fetch(10, 10*time.Millisecond)
	}
	if got := m.s.retiredCount(); got != 2 {
		t.Fatalf("%d retired requests, want 2", got)
	}
	if err := m.s.Close(); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, before)
}

// The expiry workaround runs only where the server needs it.
func TestDefaultTimingFollowsTheServerVersion(t *testing.T) {
	for _, tc := range []struct {
		version   string
		giveUp    bool
		fillGap   time.Duration
		noWaitFor time.Duration
	}{
		{"2.9.10", true, 20 * time.Millisecond, 50 * time.Millisecond},
		{"2.9.16", true, 20 * time.Millisecond, 50 * time.Millisecond},
		{"2.10.0", false, 20 * time.Millisecond, 50 * time.Millisecond},
		{"2.15.3", false, 20 * time.Millisecond, 50 * time.Millisecond},
		{"v2.11.0-RC.1", false, 20 * time.Millisecond, 50 * time.Millisecond},
		{"3.0.0", false, 20 * time.Millisecond, 50 * time.Millisecond},
		{"", true, 20 * time.Millisecond, 50 * time.Millisecond},
		{"unknown", true, 20 * time.Millisecond, 50 * time.Millisecond},
	} {
		tm := DefaultTiming(tc.version)
		if (tm.ExpiryGrace > 0) != tc.giveUp || tm.FillGap != tc.fillGap || tm.NoWaitStall != tc.noWaitFor {
			t.Errorf("DefaultTiming(%q) = %s; want expiry give-up %v, fillGap %s, noWaitStall %s", tc.version, tm, tc.giveUp, tc.fillGap, tc.noWaitFor)
		}
	}
}

func waitFor(t *testing.T, ok func() bool, format string, arg func() any) {
	t.Helper()
	deadline := time.Now().Add(fetchGuard)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf(format, arg())
		}
		time.Sleep(time.Millisecond)
	}
}

// noLeak fails the test unless, within a few seconds, no goroutine is left
// but those opts ignore. nats.go ends a pull request's own goroutine at
// most a second after the request's last message (its idle timeout), so a
// goroutine of nats.go may outlive Close by that long; one of the adapter
// (a drain) may not outlive it at all, which the fake-server test above
// proves without the wait.
func noLeak(t *testing.T, opts ...goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := goleak.Find(opts...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// On the real servers: after fetches that left a request ahead and a long
// poll open, Close leaves no goroutine behind (the connection's included).
func TestCloseLeavesNoGoroutine(t *testing.T) { onServers(t, testCloseLeavesNoGoroutine) }

func testCloseLeavesNoGoroutine(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	f.publishN(t, 30)
	before := goleak.IgnoreCurrent()
	s, err := New(t.Context(), f.cfg("leak"), testr.New(t), WithDelivery(config.Delivery{BatchSize: 10, InFlight: 1, Replicas: 1}))
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for range 5 { // 30 messages, then idle long polls
		msgs, err := s.Fetch(t.Context(), 10, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		total += len(msgs)
		if err := s.Ack(t.Context(), msgs); err != nil {
			t.Fatal(err)
		}
	}
	if total != 30 {
		t.Fatalf("fetched %d of 30", total)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := s.retiredCount(); got != 0 {
		t.Errorf("%d retired requests after Close", got)
	}
	if n := s.invalidMoves.Load(); n > 0 {
		t.Errorf("%d invalid pull request transitions", n)
	}
	noLeak(t, before)
}

// The adapter picks its timing by the server it is connected to: on 2.10
// and later no waiting request is ever given up.
func TestTimingFollowsTheConnectedServer(t *testing.T) {
	onServers(t, testTimingFollowsTheConnectedServer)
}

func testTimingFollowsTheConnectedServer(t *testing.T, srv *natstest.Server) {
	f := newFixture(t, srv)
	s, err := New(t.Context(), f.cfg("timing"), testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if s.timedFor != srv.Version || s.timing != DefaultTiming(srv.Version) {
		t.Fatalf("timing %s for server %q, want DefaultTiming(%q) = %s", s.timing, s.timedFor, srv.Version, DefaultTiming(srv.Version))
	}
	if want := !capsOf(srv.Version).expiryStatus; (s.timing.ExpiryGrace > 0) != want {
		t.Fatalf("nats-server %s: expiry give-up %v, want %v", srv.Version, s.timing.ExpiryGrace > 0, want)
	}
	// Idle long polls: on a server that ends them with a 408 none carries
	// a give-up time, so none can become late.
	for range 3 {
		if _, err := s.Fetch(t.Context(), 10, 50*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		if r := s.ahead; r != nil && capsOf(srv.Version).expiryStatus && !r.until.IsZero() {
			t.Fatalf("a long poll on nats-server %s would be given up at its expiry", srv.Version)
		}
	}
	if s.late != nil && capsOf(srv.Version).expiryStatus {
		t.Fatalf("a request was given up on nats-server %s", srv.Version)
	}
}
