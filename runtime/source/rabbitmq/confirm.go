package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// ConfirmAcks proves that the acknowledgements of batches reached the
// broker. basic.ack has no reply, so after the acks it sends a synchronous
// method on the same channel, basic.qos with the prefetch already in force
// (a no-op that answers qos-ok): the broker's channel handles a channel's
// methods in order, so its answer comes after it took every ack sent
// before. basic.qos rather than a passive queue.declare: that one closes
// the channel when the queue is gone (requeueing every delivery in hand),
// and a confirmation must never cost a redelivery.
//
// A batch is confirmed only when every delivery of it came on the current
// channel and its ack was sent (the deferred ones are sent now, one frame
// each, so a batch's confirmation never waits for an older lane).
// Deliveries of a closed channel cannot be confirmed: the broker requeued
// the ones it had not taken the ack of, and which those were is unknown. Their batches are settled when
// the redelivery's acknowledgement is (the progress record matches them by
// message_id), or proven by a prune run from the queue.
func (s *Source) ConfirmAcks(ctx context.Context, batches [][]source.Message) ([]bool, error) {
	ok := make([]bool, len(batches))
	s.mu.Lock()
	sess := s.session
	if sess == nil {
		s.mu.Unlock()
		return ok, errors.New("not connected to RabbitMQ: acknowledgements cannot be confirmed")
	}
	sendErr := s.ackTags(sess, nil, s.opts.clock.Now())
	if sendErr == nil {
		sendErr = s.ackEach(sess, slices.Collect(maps.Keys(sess.deferred)))
	}
	sent, stale := 0, 0
	for i, b := range batches {
		ok[i] = true
		for _, m := range b {
			r, isRabbit := m.Ref.(ref)
			if !isRabbit || r.gen != sess.gen {
				ok[i] = false
				stale++
				break
			}
			_, pending := sess.pending[r.tag]
			_, deferred := sess.deferred[r.tag]
			if pending || deferred {
				ok[i] = false
				break
			}
		}
		if ok[i] {
			sent++
		}
	}
	s.mu.Unlock()
	if sendErr != nil {
		return make([]bool, len(batches)), sendErr
	}
	if sent > 0 {
		if err := s.barrier(ctx, sess); err != nil {
			return make([]bool, len(batches)), fmt.Errorf("while confirming acknowledgements with a round trip on the channel (basic.qos): %w", err)
		}
	}
	if stale > 0 {
		return ok, fmt.Errorf("%d acknowledged batches came on a channel that has closed since: %w", stale, ErrStaleDelivery)
	}
	return ok, nil
}

// barrier is ConfirmAcks' round trip. amqp091 cannot abandon a call, so
// it runs aside and ctx bounds the wait: on a half-open connection it only
// ends when the heartbeat gives the connection up.
func (s *Source) barrier(ctx context.Context, sess *session) error {
	done := make(chan error, 1)
	go func() {
		sess.rpc.Lock()
		defer sess.rpc.Unlock()
		done <- sess.ch.Qos(s.cfg.Prefetch, 0, false)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer from the broker: %w", ctx.Err())
	}
}
