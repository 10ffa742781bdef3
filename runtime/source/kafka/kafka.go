// Package kafka is the Kafka adapter: a franz-go consumer group with
// auto-commit disabled, committing offsets only when a batch is acknowledged.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// Source consumes a Kafka consumer group.
//
// Polling blocks rebalances (kgo.BlockRebalanceOnPoll) until every fetched
// record has been acknowledged, so offsets are never committed for a
// partition the group moved elsewhere in between. Records fetched but never
// acknowledged before Close are not committed and go to the next owner.
//
// Records of one partition may be acknowledged out of order (in-flight
// transactions on different lanes); the committed offset only advances up
// to the lowest record still outstanding in that partition.
type Source struct {
	log       logr.Logger
	cl        *kgo.Client
	closeOnce sync.Once

	mu sync.Mutex
	// pending counts fetched records not acknowledged yet.
	pending int
	// outstanding holds, per partition, the fetched records in offset order
	// that are not yet committable (not acknowledged, or behind one that
	// is not).
	outstanding map[topicPartition]*partitionQueue
	// committed is the next offset committed per partition by this client,
	// so that acknowledging an older batch late never rewinds the group.
	committed map[topicPartition]int64
	// idleAt is when no fetched record was last outstanding: the fetch
	// overlap is paused after rebalanceEvery so a rebalance can happen.
	idleAt time.Time
}

// rebalanceEvery bounds how long overlapping fetches keep rebalances
// blocked: after it, Fetch first waits until every fetched record has been
// acknowledged and lets a pending rebalance through.
const rebalanceEvery = 2 * time.Second

// partitionQueue is one partition's fetched records in offset order and the
// offsets acknowledged among them.
type partitionQueue struct {
	records []*kgo.Record
	acked   map[int64]bool
}

type topicPartition struct {
	topic     string
	partition int32
}

var (
	_ source.Source    = (*Source)(nil)
	_ source.Confirmer = (*Source)(nil)
)

// Option customises New.
type Option func(*options)

type options struct {
	extra []kgo.Opt
	// fetchBytes bounds one fetch response (0: franz-go's 50 MiB default).
	fetchBytes int32
}

// assumedRecordBytes sizes fetches from a record count: a fetch response
// of twice MinUnacked records of about this size. A larger record is still
// returned (Kafka always returns at least the first record of a partition).
const assumedRecordBytes = 2048

// WithDelivery sizes fetch responses to what one replica holds in flight
// (2 x batchSize x inFlight records of about 2 KiB, 1-50 MiB: the batches
// its lanes commit and the ones queued; franz-go fetches in the background,
// so there is no request ahead to add) instead of franz-go's 50 MiB, so
// memory follows the batch size; polls already take batchSize records.
func WithDelivery(d config.Delivery) Option {
	return func(o *options) {
		o.fetchBytes = int32(min(max(2*d.MinUnacked(1)*assumedRecordBytes, 1<<20), 50<<20))
	}
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
	if o.fetchBytes > 0 {
		kopts = append(kopts, kgo.FetchMaxBytes(o.fetchBytes), kgo.FetchMaxPartitionBytes(o.fetchBytes))
	}
	cl, err := kgo.NewClient(append(kopts, o.extra...)...)
	if err != nil {
		return nil, fmt.Errorf("while creating the Kafka client: %w", err)
	}
	if err := cl.Ping(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("while connecting to Kafka: %w", err)
	}
	return &Source{log: log, cl: cl, committed: map[topicPartition]int64{}, outstanding: map[topicPartition]*partitionQueue{}, idleAt: time.Now()}, nil
}

func clientOptions(cfg *config.Kafka, log logr.Logger) ([]kgo.Opt, error) {
	opts, err := brokerconn.KafkaOptions(cfg.BootstrapServers, cfg.SASL, cfg.TLS, nil, brokerconn.Kafka{})
	if err != nil {
		return nil, err
	}
	return append(opts,
		kgo.ConsumerGroup(cfg.ConsumerGroup),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.WithLogger(kgoLogger{log}),
	), nil
}

// Fetch polls up to maxN records, waiting at most maxWait.
func (s *Source) Fetch(ctx context.Context, maxN int, maxWait time.Duration) ([]source.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if maxN <= 0 {
		return nil, nil
	}
	if err := s.drainForRebalance(ctx); err != nil {
		return nil, err
	}
	pollCtx, cancel := context.WithTimeout(ctx, maxWait)
	defer cancel()
	fetches := s.cl.PollRecords(pollCtx, maxN)
	records := fetches.Records()
	s.track(records)
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

// track records fetched records as outstanding, per partition in offset
// order (a poll returns each partition's records in order).
func (s *Source) track(records []*kgo.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending += len(records)
	for _, r := range records {
		tp := topicPartition{r.Topic, r.Partition}
		q := s.outstanding[tp]
		if q == nil {
			q = &partitionQueue{acked: map[int64]bool{}}
			s.outstanding[tp] = q
		}
		q.records = append(q.records, r)
	}
}

// drainForRebalance: once fetches have overlapped for rebalanceEvery without
// a moment where nothing was outstanding, wait until the in-flight records
// are acknowledged, so the group can rebalance between two polls.
func (s *Source) drainForRebalance(ctx context.Context) error {
	for {
		s.mu.Lock()
		busy := s.pending > 0 && time.Since(s.idleAt) > rebalanceEvery
		s.mu.Unlock()
		if !busy {
			return nil
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Ack commits, per partition, the offset after the highest record that has
// no unacknowledged record before it, synchronously. Once no fetched record
// is outstanding, rebalances are allowed again.
func (s *Source) Ack(ctx context.Context, msgs []source.Message) error {
	recs, err := s.acknowledge(msgs)
	defer s.allowRebalanceIfIdle()
	if err != nil || len(recs) == 0 {
		return err
	}
	if err := s.commit(ctx, recs); err != nil {
		return fmt.Errorf("while committing Kafka offsets: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range recs {
		tp := topicPartition{r.Topic, r.Partition}
		if next := r.Offset + 1; next > s.committed[tp] {
			s.committed[tp] = next
		}
	}
	return nil
}

// commit commits the offset after each of recs and returns nil only when
// the broker answered the commit for every one of their partitions without
// an error: franz-go's CommitRecords also returns nil for partitions the
// response leaves out, and for a commit it had nothing to send.
func (s *Source) commit(ctx context.Context, recs []*kgo.Record) error {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	for _, r := range recs {
		if offsets[r.Topic] == nil {
			offsets[r.Topic] = map[int32]kgo.EpochOffset{}
		}
		eo := kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
		if at, ok := offsets[r.Topic][r.Partition]; !ok || at.Less(eo) {
			offsets[r.Topic][r.Partition] = eo
		}
	}
	var rerr error
	s.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			rerr = err
			return
		}
		answered := map[topicPartition]bool{}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					rerr = fmt.Errorf("partition %s/%d: %w", t.Topic, p.Partition, err)
					return
				}
				answered[topicPartition{t.Topic, p.Partition}] = true
			}
		}
		for t, ps := range offsets {
			for p := range ps {
				if !answered[topicPartition{t, p}] {
					rerr = fmt.Errorf("the broker did not answer the commit of partition %s/%d", t, p)
					return
				}
			}
		}
	})
	return rerr
}

// acknowledge marks msgs acknowledged and returns, per partition whose
// committable prefix grew, the last record of that prefix.
func (s *Source) acknowledge(msgs []source.Message) ([]*kgo.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	touched := map[topicPartition]bool{}
	for _, m := range msgs {
		r, ok := m.Ref.(*kgo.Record)
		if !ok {
			return nil, fmt.Errorf("message %s was not fetched from Kafka", m.NativeID)
		}
		tp := topicPartition{r.Topic, r.Partition}
		q := s.outstanding[tp]
		if q == nil {
			continue // acknowledged twice, or from before a rebalance
		}
		if !q.acked[r.Offset] {
			q.acked[r.Offset] = true
			s.pending--
		}
		touched[tp] = true
	}
	var recs []*kgo.Record
	for tp := range touched {
		q := s.outstanding[tp]
		n := 0
		for n < len(q.records) && q.acked[q.records[n].Offset] {
			delete(q.acked, q.records[n].Offset)
			n++
		}
		if n == 0 {
			continue
		}
		last := q.records[n-1]
		q.records = q.records[n:]
		if len(q.records) == 0 {
			delete(s.outstanding, tp)
		}
		if next, ok := s.committed[tp]; ok && last.Offset+1 <= next {
			continue
		}
		recs = append(recs, last)
	}
	return recs, nil
}

func (s *Source) allowRebalanceIfIdle() {
	s.mu.Lock()
	if s.pending < 0 {
		s.pending = 0
	}
	idle := s.pending == 0
	if idle {
		s.idleAt = time.Now()
	}
	s.mu.Unlock()
	if idle {
		s.cl.AllowRebalance()
	}
}

// ConfirmAcks confirms a batch once the offsets this client committed (each
// CommitRecords that returned nil: the broker answered the commit) are past
// every record of it. An Ack that returned nil commits nothing when an
// older record of the partition is still outstanding, and a failed commit
// is covered by a later one; neither counts before that. No round trip.
func (s *Source) ConfirmAcks(_ context.Context, batches [][]source.Message) ([]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := make([]bool, len(batches))
	for i, b := range batches {
		ok[i] = true
		for _, m := range b {
			at, isKafka := positionOf(m)
			if !isKafka || at.offset >= s.committed[at.topicPartition] {
				ok[i] = false // not yet: no error, a later commit covers it
				break
			}
		}
	}
	return ok, nil
}

// recordAt is what is kept of a record while its offset awaits a
// committed one past it (ConfirmRef): where it is, not its value.
type recordAt struct {
	topicPartition
	offset int64
}

// ConfirmRef keeps the record's position alone.
func (s *Source) ConfirmRef(m source.Message) any {
	at, _ := positionOf(m)
	return at
}

// positionOf is where a message's record is, from its Ref (the record, or
// what ConfirmRef kept of it).
func positionOf(m source.Message) (recordAt, bool) {
	switch r := m.Ref.(type) {
	case recordAt:
		return r, r.topic != ""
	case *kgo.Record:
		return recordAt{topicPartition{r.Topic, r.Partition}, r.Offset}, true
	}
	return recordAt{}, false
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
