package rabbitmq

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	amqp "github.com/rabbitmq/amqp091-go"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
	"github.com/idempotency-dev/idc-operator/runtime/source/sourcetest"
)

// amqpURI is the RabbitMQ broker the machine runs on loopback. The tests
// fail (they do not skip) when it is down.
const (
	amqpURI = "amqp://guest:guest@127.0.0.1:5672/"
	uriEnv  = "IDC_TEST_AMQP_URI"
)

type fixture struct {
	ch    *amqp.Channel
	queue string
}

// newFixture declares a queue private to the test (the adapter never
// declares queues) and deletes it afterwards.
func newFixture(t *testing.T, args amqp.Table) *fixture {
	t.Helper()
	t.Setenv(uriEnv, amqpURI)
	conn, err := amqp.Dial(amqpURI)
	if err != nil {
		t.Fatalf("RabbitMQ at 127.0.0.1:5672 is required for this test: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ch: ch, queue: fmt.Sprintf("idc-test-%d", time.Now().UnixNano())}
	if _, err := ch.QueueDeclare(f.queue, true, false, false, false, args); err != nil {
		t.Fatalf("declaring queue: %v", err)
	}
	t.Cleanup(func() {
		if _, err := ch.QueueDelete(f.queue, false, false, false); err != nil {
			t.Errorf("deleting queue %s: %v", f.queue, err)
		}
	})
	return f
}

func (f *fixture) publish(t *testing.T, msgs []sourcetest.Outgoing) {
	t.Helper()
	for _, o := range msgs {
		err := f.ch.PublishWithContext(t.Context(), "", f.queue, false, false, amqp.Publishing{
			MessageId:     o.ID,
			CorrelationId: "corr-" + o.ID,
			Type:          "test.event",
			Timestamp:     time.Now(),
			Headers:       amqp.Table{sourcetest.IDHeader: o.ID, "n": int32(7)},
			Body:          o.Body,
		})
		if err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
}

func (f *fixture) cfg() *config.RabbitMQ {
	return &config.RabbitMQ{URIEnv: uriEnv, Queue: f.queue, Prefetch: 10}
}

func newSource(t *testing.T, cfg *config.RabbitMQ, opts ...Option) *Source {
	t.Helper()
	s, err := New(t.Context(), cfg, testr.New(t), opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestConformance uses a quorum queue, which reports x-delivery-count.
func TestConformance(t *testing.T) {
	f := newFixture(t, amqp.Table{"x-queue-type": "quorum"})
	sourcetest.Run(t, sourcetest.Harness{
		NewSource:       func(t *testing.T) source.Source { return newSource(t, f.cfg()) },
		Publish:         f.publish,
		MaxWait:         300 * time.Millisecond,
		RedeliveryAfter: time.Second,
		ReportsAttempts: true,
	})
}

func fetchN(t *testing.T, s *Source, n int) []source.Message {
	t.Helper()
	var out []source.Message
	for end := time.Now().Add(20 * time.Second); len(out) < n && time.Now().Before(end); {
		msgs, err := s.Fetch(t.Context(), n-len(out), 200*time.Millisecond)
		if err != nil {
			t.Fatalf("Fetch: %v", err)
		}
		out = append(out, msgs...)
	}
	if len(out) != n {
		t.Fatalf("fetched %d deliveries, want %d", len(out), n)
	}
	return out
}

func outgoing(ids ...string) []sourcetest.Outgoing {
	out := make([]sourcetest.Outgoing, len(ids))
	for i, id := range ids {
		out[i] = sourcetest.Outgoing{ID: id, Body: []byte("body-" + id)}
	}
	return out
}

func TestPropertiesAndHeaders(t *testing.T) {
	f := newFixture(t, nil)
	f.publish(t, outgoing("m1"))
	s := newSource(t, f.cfg())
	m := fetchN(t, s, 1)[0]
	want := map[string]string{"message_id": "m1", "correlation_id": "corr-m1", "type": "test.event", "n": "7", sourcetest.IDHeader: "m1"}
	for k, v := range want {
		if m.Headers[k] != v {
			t.Errorf("header %s = %q, want %q (all: %v)", k, m.Headers[k], v, m.Headers)
		}
	}
	if m.NativeID != "m1" || m.Attempt != 1 || time.Since(m.PublishedAt) > time.Minute {
		t.Errorf("NativeID %q Attempt %d PublishedAt %v", m.NativeID, m.Attempt, m.PublishedAt)
	}
	if err := s.Ack(t.Context(), []source.Message{m}); err != nil {
		t.Fatal(err)
	}
}

// TestOutOfOrderAckDoesNotAckOlderBatch: acknowledging a later batch first
// must not acknowledge an earlier, still outstanding one through a
// multiple-ack. Classic queue: redeliveries carry no count (Attempt 0).
func TestOutOfOrderAckDoesNotAckOlderBatch(t *testing.T) {
	f := newFixture(t, nil)
	f.publish(t, outgoing("a", "b", "c", "d", "e", "f"))
	s := newSource(t, f.cfg())
	first := fetchN(t, s, 3)
	second := fetchN(t, s, 3)
	if err := s.Ack(t.Context(), second); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s2 := newSource(t, f.cfg())
	again := fetchN(t, s2, 3)
	for i, m := range again {
		if m.NativeID != first[i].NativeID || m.Attempt != 0 {
			t.Errorf("redelivery %d: %s attempt %d, want %s attempt 0", i, m.NativeID, m.Attempt, first[i].NativeID)
		}
	}
	if err := s2.Ack(t.Context(), again); err != nil {
		t.Fatal(err)
	}
	if msgs, err := s2.Fetch(t.Context(), 10, 500*time.Millisecond); err != nil || len(msgs) != 0 {
		t.Fatalf("after acking everything: %d deliveries, %v", len(msgs), err)
	}
}

// TestReconnectAfterConnectionClosed closes the adapter's connection from
// the broker side (rabbitmqctl close_connection; the management API is not
// enabled here). Deliveries of the dead channel cannot be acknowledged; the
// next Fetch reconnects and gets them again.
func TestReconnectAfterConnectionClosed(t *testing.T) {
	f := newFixture(t, nil)
	name := fmt.Sprintf("idc-test-conn-%d", time.Now().UnixNano())
	s := newSource(t, f.cfg(), WithConnectionName(name))
	f.publish(t, outgoing("x", "y"))
	before := fetchN(t, s, 2)
	closeConnection(t, s, name)
	err := s.Ack(t.Context(), before)
	if err == nil {
		t.Fatal("Ack of deliveries from a closed connection succeeded")
	}
	// The next Fetch either reconnects, or (if the loss was not noticed
	// yet) reports it and the one after reconnects.
	var after []source.Message
	for end := time.Now().Add(30 * time.Second); len(after) < 2 && time.Now().Before(end); {
		msgs, err := s.Fetch(t.Context(), 10, 200*time.Millisecond)
		if err != nil {
			t.Logf("Fetch while recovering: %v", err)
			continue
		}
		after = append(after, msgs...)
	}
	if len(after) != 2 || after[0].NativeID != "x" || after[1].NativeID != "y" {
		t.Fatalf("after reconnect got %d deliveries: %+v", len(after), after)
	}
	if err := s.Ack(t.Context(), after); err != nil {
		t.Fatalf("Ack after reconnect: %v", err)
	}
	if err := s.Ack(t.Context(), before); !errors.Is(err, ErrStaleDelivery) {
		t.Fatalf("Ack of deliveries from the old channel: %v, want ErrStaleDelivery", err)
	}

	// Second loss while idle, with the broker unreachable for a while:
	// Fetch reports errors (never hangs) until the broker is back.
	closeConnection(t, s, name)
	t.Setenv(uriEnv, "amqp://guest:guest@127.0.0.1:1/")
	for i := range 2 {
		if msgs, err := s.Fetch(t.Context(), 10, 200*time.Millisecond); err == nil {
			t.Fatalf("Fetch %d with the broker unreachable: %d deliveries and no error", i, len(msgs))
		}
	}
	t.Setenv(uriEnv, amqpURI)
	f.publish(t, outgoing("z"))
	var got []source.Message
	for end := time.Now().Add(30 * time.Second); len(got) == 0 && time.Now().Before(end); {
		got, _ = s.Fetch(t.Context(), 10, 200*time.Millisecond)
	}
	if len(got) != 1 || got[0].NativeID != "z" {
		t.Fatalf("after the broker came back: %+v", got)
	}
	if err := s.Ack(t.Context(), got); err != nil {
		t.Fatal(err)
	}
}

// closeConnection closes the named connection with rabbitmqctl and waits
// until the client has noticed. Without rabbitmqctl it closes the socket
// from the client side instead, which exercises the same recovery path.
func closeConnection(t *testing.T, s *Source, name string) {
	t.Helper()
	conn := s.session.conn
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		t.Log("rabbitmqctl not found: closing the connection from the client side")
		_ = conn.Close()
		return
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	pid := connectionPID(t, name)
	out, err := exec.CommandContext(t.Context(), "rabbitmqctl", "-q", "close_connection", pid, "idc test").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl close_connection: %v: %s", err, out)
	}
	select {
	case <-closed:
	case <-time.After(fetchGuard):
		t.Fatalf("the client did not notice the closed connection in %s", fetchGuard)
	}
}

func connectionPID(t *testing.T, name string) string {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		// RabbitMQ 3.10 has no user_provided_name column: the connection
		// name is inside client_properties.
		out, err := exec.CommandContext(t.Context(), "rabbitmqctl", "-s", "list_connections", "pid", "client_properties").CombinedOutput()
		if err != nil {
			t.Fatalf("rabbitmqctl list_connections: %v: %s", err, out)
		}
		for line := range strings.SplitSeq(string(out), "\n") {
			pid, props, ok := strings.Cut(strings.TrimSpace(line), "\t")
			if ok && strings.Contains(props, `"`+name+`"`) {
				return pid
			}
		}
	}
	t.Fatalf("connection %q not listed by rabbitmqctl", name)
	return ""
}

func TestNewErrors(t *testing.T) {
	t.Setenv(uriEnv, "")
	if _, err := New(t.Context(), &config.RabbitMQ{URIEnv: uriEnv, Queue: "q"}, testr.New(t)); err == nil {
		t.Fatal("New accepted an empty URI variable")
	}
	t.Setenv(uriEnv, "http://user:secret@host/")
	_, err := New(t.Context(), &config.RabbitMQ{URIEnv: uriEnv, Queue: "q"}, testr.New(t))
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("bad URI: %v", err)
	}
	t.Setenv(uriEnv, amqpURI)
	if _, err := New(t.Context(), &config.RabbitMQ{URIEnv: uriEnv, Queue: fmt.Sprintf("missing-%d", time.Now().UnixNano()), Prefetch: 1}, testr.New(t)); err == nil {
		t.Fatal("New consumed a queue that does not exist")
	}
}

// TestInterleavedLanesAckExactlyTheirOwn: two in-flight transactions
// (lanes) hold interleaved delivery tags of one fetch. Each lane's ack
// must acknowledge its own tags only, never an older outstanding tag of
// the other lane through a multiple-ack.
func TestInterleavedLanesAckExactlyTheirOwn(t *testing.T) {
	f := newFixture(t, nil)
	f.publish(t, outgoing("a", "b", "c", "d", "e", "f", "g", "h"))
	s := newSource(t, f.cfg())
	msgs := fetchN(t, s, 8)
	var odd []source.Message // the other lane holds the even positions
	for i, m := range msgs {
		if i%2 == 1 {
			odd = append(odd, m)
		}
	}
	// The later half of the odd lane and a contiguous run b..d of both.
	if err := s.Ack(t.Context(), odd[2:]); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(t.Context(), msgs[1:4]); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	s2 := newSource(t, f.cfg())
	again := fetchN(t, s2, 3)
	got := []string{again[0].NativeID, again[1].NativeID, again[2].NativeID}
	if want := []string{"a", "e", "g"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("redelivered %v, want exactly the unacknowledged %v", got, want)
	}
	if err := s2.Ack(t.Context(), again); err != nil {
		t.Fatal(err)
	}
	if rest, err := s2.Fetch(t.Context(), 10, 500*time.Millisecond); err != nil || len(rest) != 0 {
		t.Fatalf("after acking everything: %d deliveries, %v", len(rest), err)
	}
}

func TestOldestPending(t *testing.T) {
	if got := oldestPending(map[uint64]struct{}{9: {}, 4: {}, 6: {}}); got != 4 {
		t.Errorf("oldestPending = %d, want 4", got)
	}
	if got := oldestPending(nil); got != ^uint64(0) {
		t.Errorf("oldestPending(empty) = %d", got)
	}
}

// TestDeferredAcks: a delivery acknowledged while an older one is in flight
// waits (it is covered by a later multiple-ack), unless it waited
// maxAckDelay: then it goes on its own. The connection is cut without
// Close (no flush), so the broker redelivers exactly what was not sent.
func TestDeferredAcks(t *testing.T) {
	f := newFixture(t, nil)
	f.publish(t, outgoing("a", "b"))
	clk := clocktesting.NewFakePassiveClock(time.Now())
	s := newSource(t, f.cfg(), WithClock(clk))
	ab := fetchN(t, s, 2)
	if err := s.Ack(t.Context(), ab[1:]); err != nil { // b, behind a
		t.Fatal(err)
	}
	s.mu.Lock()
	deferred := len(s.session.deferred)
	s.mu.Unlock()
	if deferred != 1 {
		t.Fatalf("%d deferred acks, want b's", deferred)
	}
	clk.SetTime(clk.Now().Add(maxAckDelay)) // b has waited maxAckDelay now
	f.publish(t, outgoing("c"))
	c := fetchN(t, s, 1)
	if err := s.Ack(t.Context(), c); err != nil { // b is overdue now; c waits behind a
		t.Fatal(err)
	}
	s.mu.Lock()
	_ = s.session.conn.Close() // a crash: no flush of c
	s.mu.Unlock()
	s2 := newSource(t, f.cfg())
	again := fetchN(t, s2, 2)
	if got := again[0].NativeID + "," + again[1].NativeID; got != "a,c" {
		t.Errorf("redelivered %s, want a,c (b's overdue ack was sent, c's was still deferred)", got)
	}
	if err := s2.Ack(t.Context(), again); err != nil {
		t.Fatal(err)
	}
	_ = s2.Close()
	s3 := newSource(t, f.cfg())
	if rest, err := s3.Fetch(t.Context(), 10, 500*time.Millisecond); err != nil || len(rest) != 0 {
		t.Fatalf("after a multiple-ack of a and c: %d deliveries, %v", len(rest), err)
	}
}

// publishN publishes n small messages with ids prefix-0 .. prefix-(n-1).
func (f *fixture) publishN(t *testing.T, prefix string, n int) {
	t.Helper()
	out := make([]sourcetest.Outgoing, n)
	for i := range out {
		id := fmt.Sprintf("%s-%d", prefix, i)
		out[i] = sourcetest.Outgoing{ID: id, Body: []byte(id)}
	}
	f.publish(t, out)
}

// withStillFillClock runs the fill's timers on a fake clock the test never
// moves: with the shipped fillGap, a broker that pauses for tens of
// milliseconds mid-backlog on a loaded machine ends a fill early (correct,
// but not what these tests look at). A fill that should return at once
// and waits on a timer instead never returns: fetchAtOnce fails it.
func withStillFillClock() Option {
	return func(o *options) { o.fillClock = clocktesting.NewFakeClock(time.Now()) }
}

// fetchGuard only turns a Fetch that waits on the still fill clock (which
// never fires) into a failure.
const fetchGuard = time.Minute

// fetchAtOnce runs Fetch and fails the test if it is still waiting after
// fetchGuard.
func fetchAtOnce(t *testing.T, s *Source, maxN int, maxWait time.Duration, what string) []source.Message {
	t.Helper()
	type fetched struct {
		msgs []source.Message
		err  error
	}
	done := make(chan fetched, 1)
	go func() {
		msgs, err := s.Fetch(t.Context(), maxN, maxWait)
		done <- fetched{msgs, err}
	}()
	guard := time.NewTimer(fetchGuard)
	defer guard.Stop()
	select {
	case f := <-done:
		if f.err != nil {
			t.Fatal(f.err)
		}
		return f.msgs
	case <-guard.C:
		t.Fatalf("%s: Fetch has not returned after %s; it waits on a fill timer", what, fetchGuard)
		return nil
	}
}

// TestFetchFillsFromBacklog: with a backlog in the queue (more than the
// prefetch window, so the broker holds messages ready), one Fetch returns
// a whole batch, not only what had arrived when the first delivery came
// (the broker pushes deliveries one by one; taking only those gave the
// loop transactions of about a dozen messages under a backlog).
func TestFetchFillsFromBacklog(t *testing.T) {
	f := newFixture(t, nil)
	f.publishN(t, "m", 6000)
	cfg := f.cfg()
	cfg.Prefetch = 3000
	s := newSource(t, cfg, withStillFillClock())
	msgs := fetchAtOnce(t, s, 2000, 2*time.Second, "a backlog of 6000")
	if len(msgs) != 2000 {
		t.Fatalf("Fetch of 2000 from a backlog of 6000 (prefetch 3000) returned %d", len(msgs))
	}
	if err := s.Ack(t.Context(), msgs); err != nil {
		t.Fatal(err)
	}
}

// TestFetchReturnsALoneMessageAtOnce: caught up (nothing ready in the
// queue), a Fetch returns the message that came without waiting for more:
// with the fill's clock still, a Fetch that waited for more would never
// return.
func TestFetchReturnsALoneMessageAtOnce(t *testing.T) {
	f := newFixture(t, nil)
	cfg := f.cfg()
	cfg.Prefetch = 3000
	s := newSource(t, cfg, withStillFillClock())
	f.publish(t, outgoing("lone"))
	lone := fetchAtOnce(t, s, 2000, 30*time.Second, "a lone message")
	if len(lone) != 1 {
		t.Fatalf("a lone message: %d deliveries, want 1", len(lone))
	}
	if err := s.Ack(t.Context(), lone); err != nil {
		t.Fatal(err)
	}
}

// TestFetchFillsUpToThePrefetchWindow: when the prefetch window is smaller
// than the batch, Fetch returns the whole window as soon as it is in hand
// (nothing more arrives before an ack), not a part of it and not after
// waiting: with the fill's clock still, a Fetch that waited would never
// return.
func TestFetchFillsUpToThePrefetchWindow(t *testing.T) {
	f := newFixture(t, nil)
	f.publishN(t, "w", 1000)
	cfg := f.cfg()
	cfg.Prefetch = 100
	s := newSource(t, cfg, withStillFillClock())
	msgs := fetchAtOnce(t, s, 500, 2*time.Second, "a prefetch window of 100")
	if len(msgs) != 100 {
		t.Fatalf("Fetch of 500 with a prefetch of 100 and a backlog of 1000: %d deliveries, want the window of 100", len(msgs))
	}
	if err := s.Ack(t.Context(), msgs); err != nil {
		t.Fatal(err)
	}
}
