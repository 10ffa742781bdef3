package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// maxAckDelay is how long an acknowledged delivery may wait behind an older
// one still in flight before it is acknowledged on its own.
const maxAckDelay = time.Second

// Ack acknowledges the deliveries of the current channel. Lanes commit out
// of order, so their tags interleave; acknowledging each tag on its own
// costs the broker one frame per message. Instead a tag acknowledged while
// an older one is still pending is deferred, and everything below the
// oldest pending tag goes as ONE multiple-ack (exact: every tag below it was
// acknowledged by the caller). A deferred tag that waited maxAckDelay is
// sent on its own, so a slow lane never holds the others' acks for long;
// Close sends what is left. A deferred ack lost with its channel is only a
// redelivery, which the inbox settles as a duplicate.
// Deliveries from an earlier channel yield ErrStaleDelivery.
func (s *Source) Ack(_ context.Context, msgs []source.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var tags []uint64
	stale := 0
	for _, m := range msgs {
		r, ok := m.Ref.(ref)
		if !ok {
			return fmt.Errorf("message %q was not fetched from RabbitMQ", m.NativeID)
		}
		if s.session == nil || r.gen != s.session.gen {
			stale++
			continue
		}
		tags = append(tags, r.tag)
	}
	var errs []error
	if stale > 0 {
		errs = append(errs, fmt.Errorf("%d of %d deliveries: %w", stale, len(msgs), ErrStaleDelivery))
	}
	if len(tags) > 0 {
		if err := s.ackTags(s.session, tags, s.opts.clock.Now()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Source) ackTags(sess *session, tags []uint64, now time.Time) error {
	for _, tag := range tags {
		if _, ok := sess.pending[tag]; ok {
			delete(sess.pending, tag)
			sess.deferred[tag] = now
		}
	}
	watermark := oldestPending(sess.pending)
	var below uint64
	found := false
	var overdue []uint64
	for tag, at := range sess.deferred {
		switch {
		case tag < watermark:
			below, found = max(below, tag), true
		case now.Sub(at) >= maxAckDelay:
			overdue = append(overdue, tag)
		}
	}
	if found {
		if err := sess.ch.Ack(below, true); err != nil {
			s.dropLocked(sess, "acknowledgement failed")
			return fmt.Errorf("while acknowledging deliveries up to tag %d: %w", below, err)
		}
		for tag := range sess.deferred {
			if tag <= below {
				delete(sess.deferred, tag)
			}
		}
	}
	return s.ackEach(sess, overdue)
}

// ackEach acknowledges deferred tags one by one.
func (s *Source) ackEach(sess *session, tags []uint64) error {
	slices.Sort(tags)
	for _, tag := range tags {
		if err := sess.ch.Ack(tag, false); err != nil {
			s.dropLocked(sess, "acknowledgement failed")
			return fmt.Errorf("while acknowledging delivery %d: %w", tag, err)
		}
		delete(sess.deferred, tag)
	}
	return nil
}

// oldestPending is the smallest outstanding tag (MaxUint64 when none): a
// multiple-ack up to a run's last tag is exact only when no outstanding
// tag is older than the run's first. Deliveries still buffered, not yet
// fetched, always have larger tags than every fetched one.
func oldestPending(pending map[uint64]struct{}) uint64 {
	oldest := ^uint64(0)
	for tag := range pending {
		oldest = min(oldest, tag)
	}
	return oldest
}
