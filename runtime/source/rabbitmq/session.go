package rabbitmq

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
)

func (s *Source) connect() (*session, error) {
	uri, _, err := brokerconn.AMQPURI(s.cfg.URIEnv, nil)
	if err != nil {
		return nil, err
	}
	dial, err := brokerconn.AMQPConfig(s.cfg.TLS, nil, brokerconn.AMQP{ConnectionName: s.opts.connectionName, Heartbeat: s.opts.heartbeat})
	if err != nil {
		return nil, err
	}
	conn, err := amqp.DialConfig(uri, dial)
	if err != nil {
		return nil, fmt.Errorf("while connecting to RabbitMQ: %w", err)
	}
	sess, err := s.open(conn)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return sess, nil
}

func (s *Source) open(conn *amqp.Connection) (*session, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("while opening a RabbitMQ channel: %w", err)
	}
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("while setting prefetch %d: %w", s.cfg.Prefetch, err)
	}
	deliveries, err := ch.Consume(s.queue, s.opts.consumerTag, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("while consuming queue %s: %w", s.queue, err)
	}
	s.gen++
	sess := &session{
		gen: s.gen, conn: conn, ch: ch,
		buf:      make(chan amqp.Delivery, max(s.cfg.Prefetch, 1)),
		pending:  map[uint64]struct{}{},
		deferred: map[uint64]time.Time{},
		done:     make(chan struct{}),
	}
	// The library hands deliveries over an unbuffered channel; pumping them
	// into buf lets Fetch drain what has arrived without racing the
	// library's goroutine.
	go sess.pump(deliveries)
	return sess, nil
}

func (sess *session) pump(deliveries <-chan amqp.Delivery) {
	defer close(sess.buf)
	for d := range deliveries {
		select {
		case sess.buf <- d:
		case <-sess.done:
			return
		}
	}
}

// ensureSession reconnects when the last session was lost, pausing with an
// exponential backoff between failed attempts.
func (s *Source) ensureSession(ctx context.Context) (*session, error) {
	s.mu.Lock()
	sess := s.session
	s.mu.Unlock()
	if sess != nil {
		return sess, nil
	}
	if wait := s.nextDial.Sub(s.opts.clock.Now()); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	sess, err := s.connect()
	if err != nil {
		s.backoff = min(max(2*s.backoff, minBackoff), maxBackoff)
		s.nextDial = s.opts.clock.Now().Add(s.backoff)
		return nil, fmt.Errorf("while reconnecting to RabbitMQ: %w", err)
	}
	s.backoff = 0
	s.mu.Lock()
	s.session = sess
	s.mu.Unlock()
	s.log.Info("reconnected to RabbitMQ")
	return sess, nil
}

// drop forgets a lost session; the next Fetch reconnects.
func (s *Source) drop(sess *session, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked(sess, reason)
}

func (s *Source) dropLocked(sess *session, reason string) {
	if s.session != sess {
		return
	}
	s.log.Info("RabbitMQ session lost, reconnecting on the next fetch", "reason", reason)
	s.session = nil
	_ = sess.close()
}
