package consumer

import (
	"context"
	"errors"
	"testing"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// confirmingSource is a source.Confirmer whose confirmations the test
// decides: confirm(batch) reports whether the broker confirmed it.
type confirmingSource struct {
	*fakeSource
	confirm func(batch []source.Message) bool
	err     error
	offered int
}

func (c *confirmingSource) ConfirmAcks(_ context.Context, batches [][]source.Message) ([]bool, error) {
	ok := make([]bool, len(batches))
	c.offered += len(batches)
	if c.err != nil {
		return ok, c.err
	}
	for i, b := range batches {
		ok[i] = c.confirm(b)
	}
	return ok, nil
}

func msgs(ids ...string) []source.Message {
	out := make([]source.Message, len(ids))
	for i, id := range ids {
		out[i] = source.Message{NativeID: id, Body: []byte("body of " + id)}
	}
	return out
}

// TestProgressCountsOnlyConfirmedAcks: a batch stays unacknowledged in the
// heartbeat (and a stop is not graceful) until the broker confirmed its
// acknowledgement; a failed ack never expires on a timer.
func TestProgressCountsOnlyConfirmedAcks(t *testing.T) {
	src := config.Source{NATSJetStream: &config.JetStream{Stream: "S", Consumer: "c"}}
	type step struct {
		name string
		run  func(p *progress, c *confirmingSource)
		// unacked: the heartbeat reports an unacknowledged claim;
		// graceful: a stop now would be recorded as graceful.
		unacked, graceful bool
	}
	var a, b uint64
	steps := []step{
		{"begun", func(p *progress, _ *confirmingSource) { a = p.begin() }, true, false},
		{"committed", func(p *progress, _ *confirmingSource) { p.committed(msgs("S:1", "S:2")) }, true, false},
		{"acked, not confirmed", func(p *progress, _ *confirmingSource) { p.acked(a, msgs("S:1", "S:2"), nil) }, true, false},
		{"a round trip that fails confirms nothing", func(p *progress, c *confirmingSource) {
			c.err = errors.New("nats: timeout")
			if left, err := p.confirm(context.Background(), c); err == nil || left != 1 {
				t.Errorf("confirm: %d left, %v; want 1 and the error", left, err)
			}
			c.err = nil
		}, true, false},
		{"confirmed", func(p *progress, c *confirmingSource) {
			if left, err := p.confirm(context.Background(), c); err != nil || left != 0 {
				t.Errorf("confirm: %d left, %v", left, err)
			}
		}, false, true},
		{"an ack that failed holds", func(p *progress, _ *confirmingSource) {
			b = p.begin()
			p.committed(msgs("S:3", "S:4"))
			p.acked(b, msgs("S:3", "S:4"), errors.New("not connected"))
		}, true, false},
		{"the broker does not confirm it yet", func(p *progress, c *confirmingSource) {
			c.confirm = func([]source.Message) bool { return false }
			_, _ = p.confirm(context.Background(), c)
		}, true, false},
		{"a redelivery of one of its messages confirmed: still one left", func(p *progress, c *confirmingSource) {
			tok := p.begin()
			p.committed(msgs("S:3"))
			p.acked(tok, msgs("S:3"), nil)
			c.confirm = func(b []source.Message) bool { return len(b) == 1 && b[0].NativeID == "S:3" }
			_, _ = p.confirm(context.Background(), c)
		}, true, false},
		{"the redelivery of the other confirmed: the failed batch is settled", func(p *progress, c *confirmingSource) {
			tok := p.begin()
			p.committed(msgs("S:4"))
			p.acked(tok, msgs("S:4"), nil)
			c.confirm = func(b []source.Message) bool { return len(b) == 1 && b[0].NativeID == "S:4" }
			_, _ = p.confirm(context.Background(), c)
		}, false, true},
	}
	p := newProgress("r", src)
	c := &confirmingSource{fakeSource: &fakeSource{}, confirm: func([]source.Message) bool { return true }}
	p.useSource(c)
	if !p.confirms {
		t.Fatal("a source.Confirmer was not taken for one")
	}
	for _, s := range steps {
		s.run(p, c)
		hb := p.heartbeat(false)
		if got := hb.UnackedAge != nil; got != s.unacked {
			t.Errorf("%s: unacknowledged claim reported=%v, want %v", s.name, got, s.unacked)
		}
		if got := p.heartbeat(true).Stopped; got != s.graceful {
			t.Errorf("%s: graceful stop=%v, want %v", s.name, got, s.graceful)
		}
	}
	for _, b := range p.unacked {
		for _, m := range b.msgs {
			if m.Body != nil {
				t.Errorf("progress keeps the body of %s", m.NativeID)
			}
		}
	}
	if hb := p.heartbeat(false); hb.Consumer == nil || hb.Consumer.Name != "S/c" || hb.Consumer.Kind != "NATSJetStream" {
		t.Errorf("heartbeat consumer %+v, want NATSJetStream S/c", hb.Consumer)
	}
}

// TestProgressWithoutConfirmer: a source whose Ack is the broker's answer
// (Redis XACK counted) settles on a nil Ack; a failed one holds until a
// redelivery's ack settles it, never on a timer.
func TestProgressWithoutConfirmer(t *testing.T) {
	p := newProgress("r", config.Source{RedisStreams: &config.RedisStreams{Stream: "s", Group: "g"}})
	p.useSource(&fakeSource{})
	tok := p.begin()
	p.committed(msgs("5-0"))
	p.acked(tok, msgs("5-0"), nil)
	if hb := p.heartbeat(true); !hb.Stopped || hb.UnackedAge != nil {
		t.Fatalf("a nil Ack without a Confirmer: %+v, want settled", hb)
	}
	if got := p.heartbeat(false).Positions["stream"]; got != 5<<20 {
		t.Errorf("redis position %d, want %d", got, 5<<20)
	}
	tok = p.begin()
	p.committed(msgs("6-0"))
	p.acked(tok, msgs("6-0"), errors.New("XACK acknowledged 0 of 1 entries"))
	if hb := p.heartbeat(true); hb.Stopped || hb.UnackedAge == nil {
		t.Fatalf("a failed Ack: %+v, want held", hb)
	}
	tok = p.begin()
	p.committed(msgs("6-0"))
	p.acked(tok, msgs("6-0"), nil)
	if hb := p.heartbeat(true); !hb.Stopped || hb.UnackedAge != nil {
		t.Fatalf("after the redelivery's ack: %+v, want settled", hb)
	}
}
