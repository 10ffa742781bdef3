// Package sourcetest is the conformance suite every broker adapter test runs
// against its real broker (or, for Kafka, the in-process kfake cluster): it
// checks the at-least-once contract of source.Source end to end.
package sourcetest

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// IDHeader is the header every published test message carries with its
// test id, so the suite can recognise messages independently of NativeID.
const IDHeader = "x-test-id"

// Outgoing is one message the suite asks the harness to publish.
type Outgoing struct {
	// ID is unique per message; publishers put it in IDHeader (and RabbitMQ
	// publishers also in the message_id property).
	ID   string
	Body []byte
}

// Harness binds the suite to one broker and one durable consumer / group /
// queue that is private to the test.
type Harness struct {
	// NewSource opens a new Source on the test's durable consumer, group or
	// queue. It is called several times; the suite closes every Source.
	NewSource func(t *testing.T) source.Source
	// Publish publishes the messages in order.
	Publish func(t *testing.T, msgs []Outgoing)
	// MaxWait is passed to Fetch.
	MaxWait time.Duration
	// RedeliveryAfter bounds how long an unacknowledged message takes to be
	// redelivered once its Source is closed (AckWait, lease, rebalance).
	RedeliveryAfter time.Duration
	// ReportsAttempts says the broker reports delivery counts: first
	// deliveries must have Attempt 1 and redeliveries Attempt >= 2.
	ReportsAttempts bool
}

// Run runs the suite. The subtests depend on each other's order and share
// the harness's consumer, so they run sequentially.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.MaxWait <= 0 {
		h.MaxWait = 300 * time.Millisecond
	}
	t.Run("IdleFetchReturnsEmptyAfterMaxWait", func(t *testing.T) { idle(t, h) })
	t.Run("AllDeliveredAckedNotRedelivered", func(t *testing.T) { roundTrip(t, h) })
	t.Run("UnackedRedeliveredToNewSource", func(t *testing.T) { redelivery(t, h) })
}

func open(t *testing.T, h Harness) source.Source {
	t.Helper()
	s := h.NewSource(t)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func idle(t *testing.T, h Harness) {
	s := open(t, h)
	ctx, cancel := context.WithTimeout(t.Context(), h.MaxWait+30*time.Second)
	defer cancel()
	start := time.Now()
	msgs, err := s.Fetch(ctx, 10, h.MaxWait)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("Fetch on an idle source: %v", err)
	}
	if len(msgs) != 0 {
		t.Fatalf("Fetch on an idle source returned %d messages", len(msgs))
	}
	if elapsed > h.MaxWait+5*time.Second || elapsed < h.MaxWait/2 {
		t.Fatalf("idle Fetch took %v, maxWait is %v", elapsed, h.MaxWait)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func outgoing(prefix string, n int) []Outgoing {
	out := make([]Outgoing, n)
	for i := range out {
		id := fmt.Sprintf("%s-%d-%d", prefix, i, time.Now().UnixNano())
		out[i] = Outgoing{ID: id, Body: fmt.Appendf(nil, `{"id":%q,"n":%d}`, id, i)}
	}
	return out
}

func byID(msgs []Outgoing) map[string]Outgoing {
	m := make(map[string]Outgoing, len(msgs))
	for _, o := range msgs {
		m[o.ID] = o
	}
	return m
}

func roundTrip(t *testing.T, h Harness) {
	const n, batch = 25, 7
	want := outgoing("rt", n)
	before := time.Now().Add(-2 * time.Second)
	h.Publish(t, want)
	s := open(t, h)
	expected := byID(want)
	seenNative := map[string]bool{}
	got := 0
	deadline := time.Now().Add(60 * time.Second)
	for got < n {
		if time.Now().After(deadline) {
			t.Fatalf("received %d of %d messages before the deadline", got, n)
		}
		msgs := fetch(t, s, batch, h.MaxWait)
		if len(msgs) > batch {
			t.Fatalf("Fetch(max=%d) returned %d messages", batch, len(msgs))
		}
		for _, m := range msgs {
			o := checkMessage(t, m, expected, before)
			delete(expected, o.ID)
			if seenNative[m.NativeID] {
				t.Fatalf("NativeID %q seen twice", m.NativeID)
			}
			seenNative[m.NativeID] = true
			if h.ReportsAttempts && m.Attempt != 1 {
				t.Errorf("first delivery of %s has Attempt %d, want 1", o.ID, m.Attempt)
			}
		}
		ack(t, s, msgs)
		got += len(msgs)
	}
	expectNothing(t, s, h)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	expectNothing(t, open(t, h), h)
}

// checkMessage verifies the fields every adapter must populate and returns
// the outgoing message it corresponds to.
func checkMessage(t *testing.T, m source.Message, expected map[string]Outgoing, before time.Time) Outgoing {
	t.Helper()
	id := m.Headers[IDHeader]
	o, ok := expected[id]
	if !ok {
		t.Fatalf("unexpected or duplicate message: header %s=%q, NativeID %q, headers %v", IDHeader, id, m.NativeID, m.Headers)
	}
	if !bytes.Equal(m.Body, o.Body) {
		t.Fatalf("message %s: body %q, want %q", id, m.Body, o.Body)
	}
	if m.NativeID == "" {
		t.Fatalf("message %s: empty NativeID", id)
	}
	if m.PublishedAt.Before(before) || m.PublishedAt.After(time.Now().Add(2*time.Second)) {
		t.Fatalf("message %s: PublishedAt %v outside [%v, now]", id, m.PublishedAt, before)
	}
	if m.Ref == nil {
		t.Fatalf("message %s: nil Ref", id)
	}
	return o
}

func fetch(t *testing.T, s source.Source, maxN int, maxWait time.Duration) []source.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), maxWait+30*time.Second)
	defer cancel()
	msgs, err := s.Fetch(ctx, maxN, maxWait)
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	return msgs
}

func ack(t *testing.T, s source.Source, msgs []source.Message) {
	t.Helper()
	if len(msgs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := s.Ack(ctx, msgs); err != nil {
		t.Fatalf("Ack: %v", err)
	}
}

// expectNothing fetches for longer than the redelivery delay and fails on
// any message.
func expectNothing(t *testing.T, s source.Source, h Harness) {
	t.Helper()
	until := time.Now().Add(h.RedeliveryAfter + h.MaxWait)
	for time.Now().Before(until) {
		if msgs := fetch(t, s, 10, h.MaxWait); len(msgs) > 0 {
			t.Fatalf("redelivered after ack: %d messages, first %q (headers %v)", len(msgs), msgs[0].NativeID, msgs[0].Headers)
		}
	}
}

func redelivery(t *testing.T, h Harness) {
	want := outgoing("rd", 3)
	before := time.Now().Add(-2 * time.Second)
	h.Publish(t, want)
	first := collect(t, open(t, h), byID(want), before, h.MaxWait, 60*time.Second)
	// Ack only the first delivered message (for Kafka: the lowest offset of
	// the single partition), then close without acknowledging the rest.
	s1 := first.source
	ack(t, s1, first.msgs[:1])
	if err := s1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	rest := byID(want)
	delete(rest, first.msgs[0].Headers[IDHeader])
	second := collect(t, open(t, h), rest, before, h.MaxWait, h.RedeliveryAfter+60*time.Second)
	for _, m := range second.msgs {
		orig := first.byID[m.Headers[IDHeader]]
		if m.NativeID != orig.NativeID {
			t.Errorf("redelivered NativeID %q, first delivery had %q", m.NativeID, orig.NativeID)
		}
		if !m.PublishedAt.Equal(orig.PublishedAt) {
			t.Errorf("redelivered PublishedAt %v, first delivery had %v", m.PublishedAt, orig.PublishedAt)
		}
		if h.ReportsAttempts && m.Attempt < 2 {
			t.Errorf("redelivery of %s has Attempt %d, want >= 2", m.Headers[IDHeader], m.Attempt)
		}
	}
	ack(t, second.source, second.msgs)
	expectNothing(t, second.source, h)
}

type collected struct {
	source source.Source
	msgs   []source.Message
	byID   map[string]source.Message
}

// collect fetches until every expected message arrived.
func collect(t *testing.T, s source.Source, expected map[string]Outgoing, before time.Time, maxWait, timeout time.Duration) collected {
	t.Helper()
	c := collected{source: s, byID: map[string]source.Message{}}
	n := len(expected)
	deadline := time.Now().Add(timeout)
	for len(c.msgs) < n {
		if time.Now().After(deadline) {
			t.Fatalf("received %d of %d messages within %v", len(c.msgs), n, timeout)
		}
		for _, m := range fetch(t, s, 10, maxWait) {
			o := checkMessage(t, m, expected, before)
			delete(expected, o.ID)
			c.msgs = append(c.msgs, m)
			c.byID[o.ID] = m
		}
	}
	return c
}
