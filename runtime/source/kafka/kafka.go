// Package kafka is the Kafka adapter: a franz-go consumer group with
// auto-commit disabled, committing offsets only when a batch is acknowledged.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// Source consumes a Kafka consumer group.
//
// Polling blocks rebalances (kgo.BlockRebalanceOnPoll) until every fetched
// record has been acknowledged, so offsets are never committed for a
// partition the group moved elsewhere in between. Records fetched but never
// acknowledged before Close are not committed and go to the next owner.
type Source struct {
	log       logr.Logger
	cl        *kgo.Client
	closeOnce sync.Once

	mu sync.Mutex
	// pending counts fetched records not acknowledged yet.
	pending int
	// committed is the next offset committed per partition by this client,
	// so that acknowledging an older batch late never rewinds the group.
	committed map[topicPartition]int64
}

type topicPartition struct {
	topic     string
	partition int32
}

var _ source.Source = (*Source)(nil)

// Option customises New.
type Option func(*options)

type options struct {
	extra []kgo.Opt
}

// WithClientOptions appends franz-go options (after the ones New derives
// from the config), e.g. session timeouts or a client id.
func WithClientOptions(opts ...kgo.Opt) Option {
	return func(o *options) { o.extra = append(o.extra, opts...) }
}

// New creates the group consumer and checks that a broker is reachable. The
// group joins on the first Fetch. A group without committed offsets starts
// at the earliest offset.
func New(ctx context.Context, cfg *config.Kafka, logger logr.Logger, opts ...Option) (*Source, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	log := logger.WithValues("group", cfg.ConsumerGroup)
	kopts, err := clientOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(kopts, o.extra...)...)
	if err != nil {
		return nil, fmt.Errorf("while creating the Kafka client: %w", err)
	}
	if err := cl.Ping(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("while connecting to Kafka: %w", err)
	}
	return &Source{log: log, cl: cl, committed: map[topicPartition]int64{}}, nil
}

func clientOptions(cfg *config.Kafka, log logr.Logger) ([]kgo.Opt, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.BootstrapServers...),
		kgo.ConsumerGroup(cfg.ConsumerGroup),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.WithLogger(kgoLogger{log}),
	}
	if cfg.SASL != nil {
		m, err := mechanism(cfg.SASL)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.SASL(m))
	}
	tc, err := cfg.TLS.ClientConfig()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	return opts, nil
}

// mechanism reads the SASL credentials from the environment variables the
// config names.
func mechanism(c *config.SASL) (sasl.Mechanism, error) {
	user, pass := os.Getenv(c.UsernameEnv), os.Getenv(c.PasswordEnv)
	if user == "" || pass == "" {
		return nil, fmt.Errorf("environment variables %s and %s (Kafka SASL credentials) must both be set", c.UsernameEnv, c.PasswordEnv)
	}
	switch strings.ToUpper(c.Mechanism) {
	case "PLAIN":
		return plain.Auth{User: user, Pass: pass}.AsMechanism(), nil
	case "SCRAM-SHA-256":
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism(), nil
	case "SCRAM-SHA-512":
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("unsupported Kafka SASL mechanism %q (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", c.Mechanism)
}

// Fetch polls up to maxN records, waiting at most maxWait.
func (s *Source) Fetch(ctx context.Context, maxN int, maxWait time.Duration) ([]source.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if maxN <= 0 {
		return nil, nil
	}
	pollCtx, cancel := context.WithTimeout(ctx, maxWait)
	defer cancel()
	fetches := s.cl.PollRecords(pollCtx, maxN)
	records := fetches.Records()
	s.mu.Lock()
	s.pending += len(records)
	s.mu.Unlock()
	err := s.pollError(ctx, fetches)
	if len(records) == 0 {
		s.allowRebalanceIfIdle()
		return nil, err
	}
	if err != nil {
		// The records are good; the partition errors are retried by the
		// client.
		s.log.Error(err, "Kafka poll returned records and partition errors", "records", len(records))
	}
	msgs := make([]source.Message, len(records))
	for i, r := range records {
		msgs[i] = convert(r)
	}
	return msgs, nil
}

// pollError ignores the injected error of the maxWait timeout and joins the
// others.
func (s *Source) pollError(ctx context.Context, fetches kgo.Fetches) error {
	var errs []error
	for _, fe := range fetches.Errors() {
		timeout := errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled)
		if timeout && ctx.Err() == nil {
			continue
		}
		if timeout {
			return ctx.Err()
		}
		errs = append(errs, fmt.Errorf("topic %q partition %d: %w", fe.Topic, fe.Partition, fe.Err))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("while polling Kafka: %w", errors.Join(errs...))
}

func convert(r *kgo.Record) source.Message {
	headers := make(map[string]string, len(r.Headers))
	for _, h := range r.Headers {
		if _, ok := headers[h.Key]; !ok {
			headers[h.Key] = string(h.Value)
		}
	}
	return source.Message{
		NativeID:    r.Topic + "/" + strconv.FormatInt(int64(r.Partition), 10) + "/" + strconv.FormatInt(r.Offset, 10),
		Headers:     headers,
		Body:        r.Value,
		PublishedAt: r.Timestamp,
		Ref:         r,
	}
}

// Ack commits, per partition, the offset after the highest acknowledged
// record, synchronously. Committing a record also commits every earlier
// record of its partition: acknowledge batches completely and in order.
// Once no fetched record is outstanding, rebalances are allowed again.
func (s *Source) Ack(ctx context.Context, msgs []source.Message) error {
	s.mu.Lock()
	s.pending -= len(msgs)
	s.mu.Unlock()
	defer s.allowRebalanceIfIdle()
	recs, err := s.toCommit(msgs)
	if err != nil || len(recs) == 0 {
		return err
	}
	if err := s.cl.CommitRecords(ctx, recs...); err != nil {
		return fmt.Errorf("while committing Kafka offsets: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range recs {
		s.committed[topicPartition{r.Topic, r.Partition}] = r.Offset + 1
	}
	return nil
}

// toCommit returns the highest record per partition, skipping partitions
// whose committed offset is already past it.
func (s *Source) toCommit(msgs []source.Message) ([]*kgo.Record, error) {
	highest := map[topicPartition]*kgo.Record{}
	for _, m := range msgs {
		r, ok := m.Ref.(*kgo.Record)
		if !ok {
			return nil, fmt.Errorf("message %s was not fetched from Kafka", m.NativeID)
		}
		tp := topicPartition{r.Topic, r.Partition}
		if h, ok := highest[tp]; !ok || r.Offset > h.Offset {
			highest[tp] = r
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	recs := make([]*kgo.Record, 0, len(highest))
	for tp, r := range highest {
		if next, ok := s.committed[tp]; ok && r.Offset+1 <= next {
			continue
		}
		recs = append(recs, r)
	}
	return recs, nil
}

func (s *Source) allowRebalanceIfIdle() {
	s.mu.Lock()
	if s.pending < 0 {
		s.pending = 0
	}
	idle := s.pending == 0
	s.mu.Unlock()
	if idle {
		s.cl.AllowRebalance()
	}
}

// Close leaves the group without committing: records fetched but not
// acknowledged are consumed again by the partition's next owner.
func (s *Source) Close() error {
	s.closeOnce.Do(s.cl.CloseAllowingRebalance)
	return nil
}

// kgoLogger forwards franz-go logs to logr: errors as errors, warnings at
// V(0), info at V(1), debug at V(2).
type kgoLogger struct{ log logr.Logger }

func (kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	switch level {
	case kgo.LogLevelError:
		l.log.Error(nil, msg, keyvals...)
	case kgo.LogLevelWarn:
		l.log.Info(msg, keyvals...)
	case kgo.LogLevelInfo:
		l.log.V(1).Info(msg, keyvals...)
	default:
		l.log.V(2).Info(msg, keyvals...)
	}
}
