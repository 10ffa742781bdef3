package consumer

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// fakeSource is an in-memory broker with at-least-once semantics: fetched
// messages stay in flight until acked, and redeliver() puts the unacked ones
// back, as a broker does after a consumer crash. Real brokers are covered by
// the adapters' own tests.
type fakeSource struct {
	mu       sync.Mutex
	pending  []source.Message
	inflight map[string]source.Message
	acked    map[string]int
	ackErrs  int // the next ackErrs Ack calls fail (after acking nothing)
	fetches  int
	acks     int // Ack calls that acknowledged
	// redelivered counts the messages refusingAcks gave back.
	redelivered int
}

func newFakeSource(msgs []source.Message) *fakeSource {
	return &fakeSource{pending: msgs, inflight: map[string]source.Message{}, acked: map[string]int{}}
}

func (f *fakeSource) Fetch(ctx context.Context, max int, maxWait time.Duration) ([]source.Message, error) {
	f.mu.Lock()
	f.fetches++
	if len(f.pending) > 0 {
		n := min(max, len(f.pending))
		out := append([]source.Message(nil), f.pending[:n]...)
		f.pending = f.pending[n:]
		for i := range out {
			out[i].Attempt++
			f.inflight[out[i].NativeID] = out[i]
		}
		f.mu.Unlock()
		return out, nil
	}
	f.mu.Unlock()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(maxWait):
		return nil, nil
	}
}

func (f *fakeSource) Ack(_ context.Context, msgs []source.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ackErrs > 0 {
		f.ackErrs--
		return errAckRefused
	}
	for _, m := range msgs {
		delete(f.inflight, m.NativeID)
		f.acked[m.NativeID]++
	}
	f.acks++
	return nil
}

func (f *fakeSource) Close() error { return nil }

// redeliver makes every unacked in-flight message available again.
func (f *fakeSource) redeliver() {
	f.mu.Lock()
	defer f.mu.Unlock()
	var back []source.Message
	for _, m := range f.inflight {
		back = append(back, m)
	}
	sort.Slice(back, func(i, j int) bool { return back[i].NativeID < back[j].NativeID })
	f.pending = append(back, f.pending...)
	f.inflight = map[string]source.Message{}
}

// settled reports whether every message was acked and none is waiting.
func (f *fakeSource) settled(total int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending) == 0 && len(f.inflight) == 0 && len(f.acked) == total
}

type ackError struct{}

func (ackError) Error() string { return "ack refused by the fake broker" }

var errAckRefused error = ackError{}
