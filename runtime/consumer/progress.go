package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/pause"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// progress is what this replica's heartbeat reports (retention.Hold): the
// claim transactions begun and not yet settled, the last commit and the
// highest broker positions claimed. Lanes touch it once per batch.
//
// A batch is settled once the broker confirmed its acknowledgement: at
// once when Ack returns nil on a source that is no source.Confirmer (Redis:
// XACK counted every entry), else when ConfirmAcks says so for it (a round
// trip after the acks, or a committed offset past them). A batch whose Ack
// failed stays unsettled until the broker confirms it after all (offered to
// ConfirmAcks again), or until every message of it was delivered again and
// that acknowledgement confirmed (matched by NativeID); there is no time
// after which it stops counting, so a replica that stops with one holds
// pruning until a prune run proves from the broker that it settled.
type progress struct {
	replica string
	// positionOf parses a message's broker position (nil: the broker has
	// no positions worth reporting).
	positionOf func(nativeID string) (string, int64, bool)
	// confirms: Ack returning nil proves nothing by itself (the source is a
	// source.Confirmer).
	confirms bool
	// confirmRef, when the source has one, is what is kept of a message's
	// Ref while its ack awaits confirmation.
	confirmRef source.ConfirmRefer
	consumer   inbox.ConsumerIdentity

	mu         sync.Mutex
	next       uint64
	unacked    map[uint64]*batchState // by token
	lastCommit time.Time
	positions  map[string]int64
	// awaiting counts failed acks' messages by NativeID: a confirmed
	// acknowledgement of a redelivery settles them.
	awaiting map[string][]uint64
}

// batchState is one claim transaction's batch until it is settled.
type batchState struct {
	began time.Time
	// acked: Ack returned (the batch now awaits confirmation); failed:
	// it returned an error.
	acked, failed bool
	// msgs is what ConfirmAcks needs of the batch (NativeID and Ref).
	msgs []source.Message
	// left counts the messages of a failed batch not yet settled by a
	// confirmed redelivery.
	left int
}

func newProgress(replica string, src config.Source) *progress {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	p := &progress{
		// A restarted container keeps its pod name: the suffix keeps the
		// record its predecessor left (and may still need) apart.
		replica:   replica + "-" + hex.EncodeToString(suffix),
		unacked:   map[uint64]*batchState{},
		positions: map[string]int64{}, awaiting: map[string][]uint64{},
		consumer: retention.IdentityOf(src, nil),
	}
	switch {
	case src.NATSJetStream != nil:
		p.positionOf = splitPosition(':') // "<stream>:<stream seq>"
	case src.Kafka != nil:
		p.positionOf = splitPosition('/') // "<topic>/<partition>/<offset>"
	case src.RedisStreams != nil:
		p.positionOf = func(id string) (string, int64, bool) { // the entry ID
			n, ok := retention.RedisPosition(id)
			return "stream", n, ok
		}
	}
	return p
}

// useSource notes what the opened source can tell: whether its acks need
// confirming, and the consumer's creation time.
func (p *progress) useSource(src source.Source) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, p.confirms = src.(source.Confirmer)
	p.confirmRef, _ = src.(source.ConfirmRefer)
	if ct, ok := src.(source.CreationTimer); ok {
		if t := ct.ConsumerCreated(); !t.IsZero() {
			p.consumer.Created = &t
		}
	}
}

// splitPosition parses "<key><sep><n>".
func splitPosition(sep byte) func(string) (string, int64, bool) {
	return func(id string) (string, int64, bool) {
		i := strings.LastIndexByte(id, sep)
		if i <= 0 {
			return "", 0, false
		}
		n, err := strconv.ParseInt(id[i+1:], 10, 64)
		return id[:i], n, err == nil
	}
}

// begin is called before a batch's claim transaction begins.
func (p *progress) begin() uint64 {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	p.unacked[p.next] = &batchState{began: now}
	return p.next
}

// committed notes a committed batch.
func (p *progress) committed(msgs []source.Message) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastCommit = now
	if p.positionOf == nil {
		return
	}
	for i := range msgs {
		if k, n, ok := p.positionOf(msgs[i].NativeID); ok && n > p.positions[k] {
			p.positions[k] = n
		}
	}
}

// acked notes that the batch's Ack returned (err: how). Without a
// Confirmer a successful Ack settles it; otherwise, and after a failed
// Ack, it awaits the broker's confirmation.
func (p *progress) acked(token uint64, msgs []source.Message, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.unacked[token]
	if b == nil {
		return
	}
	if err == nil && !p.confirms {
		p.settledLocked(token, msgs)
		return
	}
	b.acked, b.failed = true, err != nil
	// Only what confirming needs: the bodies are not kept.
	b.msgs = make([]source.Message, len(msgs))
	for i := range msgs {
		ref := msgs[i].Ref
		if p.confirmRef != nil {
			ref = p.confirmRef.ConfirmRef(msgs[i])
		}
		b.msgs[i] = source.Message{NativeID: msgs[i].NativeID, Ref: ref}
	}
	if b.failed {
		b.left = len(msgs)
		for i := range msgs {
			if id := msgs[i].NativeID; id != "" {
				p.awaiting[id] = append(p.awaiting[id], token)
			}
		}
	}
}

// settledLocked ends token: the broker confirmed the acknowledgement of
// msgs. A failed batch waiting for a redelivery of one of msgs counts it
// settled.
func (p *progress) settledLocked(token uint64, msgs []source.Message) {
	if b := p.unacked[token]; b != nil && b.failed {
		p.forgetAwaitingLocked(token, b)
	}
	delete(p.unacked, token)
	if len(p.awaiting) == 0 {
		return
	}
	for i := range msgs {
		toks, ok := p.awaiting[msgs[i].NativeID]
		if !ok {
			continue
		}
		delete(p.awaiting, msgs[i].NativeID)
		for _, t := range toks {
			if b := p.unacked[t]; b != nil && t != token {
				if b.left--; b.left <= 0 {
					p.forgetAwaitingLocked(t, b)
					delete(p.unacked, t)
				}
			}
		}
	}
}

func (p *progress) forgetAwaitingLocked(token uint64, b *batchState) {
	for i := range b.msgs {
		id := b.msgs[i].NativeID
		toks := p.awaiting[id]
		for j, t := range toks {
			if t == token {
				toks = append(toks[:j], toks[j+1:]...)
				break
			}
		}
		if len(toks) == 0 {
			delete(p.awaiting, id)
		} else {
			p.awaiting[id] = toks
		}
	}
}

// confirm asks the source to confirm every batch whose Ack returned, and
// settles the ones it confirmed. It reports how many batches still await
// confirmation and the source's error.
func (p *progress) confirm(ctx context.Context, c source.Confirmer) (int, error) {
	p.mu.Lock()
	var tokens []uint64
	for tok, b := range p.unacked {
		if b.acked {
			tokens = append(tokens, tok)
		}
	}
	slices.Sort(tokens)
	batches := make([][]source.Message, len(tokens))
	for i, tok := range tokens {
		batches[i] = p.unacked[tok].msgs
	}
	p.mu.Unlock()
	if len(batches) == 0 {
		return 0, nil
	}
	ok, err := c.ConfirmAcks(ctx, batches)
	p.mu.Lock()
	defer p.mu.Unlock()
	left := 0
	for i, tok := range tokens {
		if i < len(ok) && ok[i] {
			p.settledLocked(tok, batches[i])
		} else if p.unacked[tok] != nil {
			left++
		}
	}
	return left, err
}

// heartbeat is the record to write now; stopping marks a graceful stop,
// which it is only when every committed claim's acknowledgement was
// confirmed by the broker.
func (p *progress) heartbeat(stopping bool) inbox.Heartbeat {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	consumer := p.consumer
	hb := inbox.Heartbeat{Replica: p.replica, Positions: make(map[string]int64, len(p.positions)), Consumer: &consumer}
	for k, v := range p.positions {
		hb.Positions[k] = v
	}
	if !p.lastCommit.IsZero() {
		age := now.Sub(p.lastCommit)
		hb.LastCommitAge = &age
	}
	var oldest time.Time
	for _, b := range p.unacked {
		if oldest.IsZero() || b.began.Before(oldest) {
			oldest = b.began
		}
	}
	if !oldest.IsZero() {
		age := now.Sub(oldest)
		hb.UnackedAge = &age
	}
	hb.Stopped = stopping && hb.UnackedAge == nil
	return hb
}

// unsettled counts the batches not settled: (awaiting confirmation, failed).
func (p *progress) unsettled() (awaiting, failed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.unacked {
		switch {
		case b.failed:
			failed++
		case b.acked:
			awaiting++
		}
	}
	return awaiting, failed
}

// registerProgress writes this replica's first progress record, retrying
// until the database takes it: a replica that could crash between COMMIT
// and ack before its first heartbeat must be on record before it fetches.
func (c *Consumer) registerProgress(ctx context.Context) bool {
	for n := 1; ; n++ {
		err := c.store.WriteHeartbeat(ctx, c.progress.heartbeat(false))
		if err == nil {
			return true
		}
		c.log.Error(err, "Cannot record this replica's progress yet; not fetching until it is recorded", "attempt", n)
		if !pause.For(ctx, backoff(n, c.delivery.BackoffInitial.Duration, c.delivery.BackoffMax.Duration)) {
			return false
		}
	}
}

// confirmInterval is how often the acks that await the broker's
// confirmation are confirmed (off the hot path: one round trip for every
// batch acknowledged since).
const confirmInterval = 200 * time.Millisecond

// confirmTimeout bounds one confirming round, and the last one at a stop.
const confirmTimeout = 5 * time.Second

// confirmAcks confirms acknowledgements every confirmInterval until ctx ends.
func (c *Consumer) confirmAcks(ctx context.Context, conf source.Confirmer) {
	t := time.NewTicker(confirmInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, confirmTimeout)
		left, err := c.progress.confirm(cctx, conf)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			failing = true
			c.log.Error(err, "The broker has not confirmed acknowledgements yet; their claims keep holding pruning back", "batches", left)
		case err == nil && failing:
			failing = false
			c.log.Info("The broker confirmed the acknowledgements again", "batchesLeft", left)
		}
	}
}

// finishConfirming is the last confirming round, after the loop stopped
// and before the source closes.
func (c *Consumer) finishConfirming(ctx context.Context) {
	conf, ok := unwrap(c.src).(source.Confirmer)
	if !ok {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), confirmTimeout)
	defer cancel()
	if left, err := c.progress.confirm(cctx, conf); err != nil || left > 0 {
		c.log.Error(err, "Stopping with acknowledgements the broker has not confirmed; this stop is not graceful and pruning holds back from this replica's record until the broker shows its claims settled",
			"batches", left)
	}
}

// unwrap is the adapter under the wrappers the binary puts around it
// (which implement Unwrap).
func unwrap(src source.Source) source.Source {
	for {
		u, ok := src.(interface{ Unwrap() source.Source })
		if !ok {
			return src
		}
		src = u.Unwrap()
	}
}

// reportProgress writes the progress record every retention.ProgressInterval
// until ctx ends.
func (c *Consumer) reportProgress(ctx context.Context) {
	every(ctx, retention.ProgressInterval, func() {
		if err := c.store.WriteHeartbeat(ctx, c.progress.heartbeat(false)); err != nil && ctx.Err() == nil {
			c.log.Error(err, "Could not record this replica's progress; pruning holds back from its last record")
		}
	})
}

// FinishProgress writes the last progress record after the loop and the
// source stopped (the source's Close flushes the last acks): a graceful stop
// when every committed claim was acknowledged and the source closed cleanly,
// so it holds nothing back.
func (c *Consumer) FinishProgress(ctx context.Context, closedCleanly bool) error {
	hb := c.progress.heartbeat(closedCleanly)
	if err := c.store.WriteHeartbeat(ctx, hb); err != nil {
		return err
	}
	if !hb.Stopped {
		awaiting, failed := c.progress.unsettled()
		c.log.Info("Stopped with claims committed but not acknowledged; pruning holds back from this replica's record until the broker settles them",
			"progressReplica", hb.Replica, "awaitingConfirmation", awaiting, "ackFailed", failed, "closedCleanly", closedCleanly)
	}
	return nil
}
