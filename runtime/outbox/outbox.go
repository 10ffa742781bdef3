// Package outbox is the transactional outbox of spec.emit: the writer turns
// the new messages of a claim transaction into <inbox>_outbox rows (in that
// same transaction), and the relay, running in every replica, publishes the
// unsent rows with their stable derived id as the broker's dedup key and
// marks them sent in the transaction that claimed them.
package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// EventID is the stable id of the event that message sourceID emits to
// target (config.Emit.Target, e.g. "natsJetStream:order-projected"): the
// first 32 hex digits (128 bits) of SHA-256(sourceID + "\x00" + target).
// A redelivered or replayed message, and a relay that publishes a row again
// after a crash, always produce the same id, so the broker (JetStream
// Nats-Msg-Id) and the next IdempotentConsumer dedupe it.
func EventID(sourceID, target string) string {
	sum := sha256.Sum256([]byte(sourceID + "\x00" + target))
	return hex.EncodeToString(sum[:16])
}

// Writer builds the outbox rows of new messages.
type Writer struct {
	target string
	// fields is nil for the default payload (the incoming one).
	fields  []field
	headers []header
	changed bool
	key     *extract.Extractor
	// requireJSON refuses a payload that is not JSON (the http endpoint
	// takes application/json), as the inline effect does.
	requireJSON bool
}

type header struct {
	name string
	expr extract.Expr
}

type field struct {
	name []byte // JSON-quoted
	expr extract.Expr
}

// NewWriter compiles the emit config. key is the entity key extractor (nil
// without message.entity): rows of one key land in one shard, which the
// relay publishes in order.
func NewWriter(cfg *config.Emit, key *extract.Extractor) (*Writer, error) {
	w := &Writer{target: cfg.Target(), changed: cfg.When == config.EmitChanged, key: key}
	names := make([]string, 0, len(cfg.Payload))
	for n := range cfg.Payload {
		names = append(names, n)
	}
	sort.Strings(names) // the same payload bytes on every replica
	for _, n := range names {
		e, err := extract.Compile(cfg.Payload[n])
		if err != nil {
			return nil, fmt.Errorf("while compiling emit.payload.%s: %w", n, err)
		}
		q, _ := json.Marshal(n) // marshalling a string cannot fail
		w.fields = append(w.fields, field{name: q, expr: e})
	}
	for n, src := range cfg.Headers {
		e, err := extract.Compile(src)
		if err != nil {
			return nil, fmt.Errorf("while compiling emit.headers.%s: %w", n, err)
		}
		w.headers = append(w.headers, header{name: n, expr: e})
	}
	return w, nil
}

// NewHTTPWriter is the writer of the http effect with delivery: Outbox: one
// row per new message, carrying the incoming payload, for the dispatcher.
func NewHTTPWriter(cfg *config.HTTP, key *extract.Extractor) *Writer {
	return &Writer{target: HTTPTarget(cfg), key: key, requireJSON: true}
}

// HTTPTarget names an http endpoint in the derived event id.
func HTTPTarget(cfg *config.HTTP) string { return "http:" + cfg.Method + " " + cfg.URL }

// OnlyChanged reports whether only records that changed state emit
// (emit.when: Changed).
func (w *Writer) OnlyChanged() bool { return w.changed }

// Row builds the outbox row of one new message. An error means the
// message's payload cannot give the declared fields: the message's own fault.
func (w *Writer) Row(m *extract.Message) (inbox.OutboxRow, error) {
	if w.requireJSON && !m.ValidJSON() {
		return inbox.OutboxRow{}, extract.ErrInvalidJSON
	}
	payload := m.Body
	if w.fields != nil {
		buf := []byte{'{'}
		for i, f := range w.fields {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, f.name...)
			buf = append(buf, ':')
			var err error
			if buf, err = f.expr.AppendJSON(buf, m); err != nil {
				return inbox.OutboxRow{}, fmt.Errorf("emit payload field %s: %w", f.name, err)
			}
		}
		payload = append(buf, '}')
	}
	var headers map[string]string
	if len(w.headers) > 0 {
		headers = make(map[string]string, len(w.headers))
		for _, h := range w.headers {
			v, err := h.expr.Text(m)
			if err != nil {
				return inbox.OutboxRow{}, fmt.Errorf("emit header %s: %w", h.name, err)
			}
			headers[h.name] = v
		}
	}
	shardKey, orderKey := m.ID, ""
	if w.key != nil {
		if k, err := w.key.Text(m); err == nil {
			shardKey, orderKey = k, k
		}
	}
	return inbox.OutboxRow{EventID: EventID(m.ID, w.target), SourceID: m.ID, Shard: Shard(shardKey), Payload: payload,
		Headers: headers, OrderKey: orderKey}, nil
}

// Shard is FNV-1a of key modulo inbox.OutboxShards.
func Shard(key string) int { return inbox.OutboxShard(key) }
