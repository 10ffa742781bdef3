package mysql

// The operations of this file are not done on MySQL yet (issue 35's next
// slice): each says so with sink.ErrUnsupported.

import (
	"context"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

func (s *Inbox) Check(context.Context, inbox.OwnerClaim) (inbox.Identity, int, bool, error) {
	return inbox.Identity{}, 0, false, sink.ErrUnsupported
}

func (s *Inbox) MarkRestored(context.Context, string) error { return sink.ErrUnsupported }

func (s *Inbox) DropOwned(context.Context, inbox.Owner) error { return sink.ErrUnsupported }

func (s *Inbox) Stats(context.Context) (inbox.Stats, error) {
	return inbox.Stats{}, sink.ErrUnsupported
}

// EnsurePartitions is a no-op in the Table layout, the only one so far.
func (s *Inbox) EnsurePartitions(context.Context, time.Time, int) error { return nil }

// EnsurePartitionsFor is a no-op in the Table layout.
func (s *Inbox) EnsurePartitionsFor(context.Context, []time.Time) error { return nil }

// ForgetPartitions is a no-op in the Table layout.
func (s *Inbox) ForgetPartitions() {}

func (s *Inbox) PrunePartitions(context.Context, inbox.Bound) (inbox.PruneResult, error) {
	return inbox.PruneResult{}, sink.ErrUnsupported
}
