package mysql

// The operations of this file are not done on MySQL yet (issue 35's next
// slice): each says so with sink.ErrUnsupported.

import (
	"context"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

func (s *Inbox) Existing(context.Context, []string) (map[string]struct{}, error) {
	return nil, sink.ErrUnsupported
}

func (s *Inbox) Conflicts(context.Context, sink.Tx, []inbox.Claim, map[string]struct{}) ([]inbox.Conflict, error) {
	return nil, sink.ErrUnsupported
}

func (s *Inbox) RecordConflicts(context.Context, sink.Tx, []inbox.ConflictRecord) error {
	return sink.ErrUnsupported
}

func (s *Inbox) ConflictCount(context.Context) (int64, error) { return 0, sink.ErrUnsupported }

func (s *Inbox) WriteOutbox(context.Context, sink.Tx, []inbox.OutboxRow) error {
	return sink.ErrUnsupported
}

func (s *Inbox) ClaimOutboxShard(context.Context, sink.Tx, int, int) ([]inbox.PendingEvent, bool, error) {
	return nil, false, sink.ErrUnsupported
}

func (s *Inbox) MarkOutboxSent(context.Context, sink.Tx, []int64) error { return sink.ErrUnsupported }

func (s *Inbox) NoteOutboxFailure(context.Context, sink.Tx, []int64, string, bool) (map[int64]int, error) {
	return nil, sink.ErrUnsupported
}

func (s *Inbox) DeadLetterOutbox(context.Context, sink.Tx, inbox.PendingEvent, string, string) error {
	return sink.ErrUnsupported
}

func (s *Inbox) OutboxStats(context.Context) (inbox.OutboxStats, error) {
	return inbox.OutboxStats{}, sink.ErrUnsupported
}

func (s *Inbox) PruneOutbox(context.Context, time.Duration, int, time.Duration) (int64, error) {
	return 0, sink.ErrUnsupported
}

func (s *Inbox) ListDeadLetters(context.Context, inbox.DeadLetterFilter, int) (inbox.DeadLetterListing, error) {
	return inbox.DeadLetterListing{}, sink.ErrUnsupported
}

func (s *Inbox) SelectDeadLetters(context.Context, inbox.DeadLetterFilter) ([]int64, error) {
	return nil, sink.ErrUnsupported
}

func (s *Inbox) LockDeadLetter(context.Context, sink.Tx, int64) (*inbox.StoredDeadLetter, error) {
	return nil, sink.ErrUnsupported
}

func (s *Inbox) DeleteDeadLetter(context.Context, sink.Tx, int64) error { return sink.ErrUnsupported }

func (s *Inbox) FailDeadLetterAgain(context.Context, sink.Tx, int64, string, string) error {
	return sink.ErrUnsupported
}

func (s *Inbox) RecordRedrive(context.Context, sink.Tx, inbox.Redrive) error {
	return sink.ErrUnsupported
}

func (s *Inbox) RedriveSummary(context.Context, string) (inbox.RedriveSummary, error) {
	return inbox.RedriveSummary{}, sink.ErrUnsupported
}

func (s *Inbox) RequeueOutbox(context.Context, sink.Tx, inbox.StoredDeadLetter) error {
	return sink.ErrUnsupported
}
