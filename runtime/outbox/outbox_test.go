package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// The documented formula, computed independently.
func TestEventIDFormula(t *testing.T) {
	sum := sha256.Sum256([]byte("ord-1\x00natsJetStream:order-projected"))
	want := hex.EncodeToString(sum[:])[:32]
	if got := EventID("ord-1", "natsJetStream:order-projected"); got != want {
		t.Fatalf("EventID = %s, want %s", got, want)
	}
	if EventID("ord-1", "natsJetStream:a") == EventID("ord-1", "natsJetStream:b") {
		t.Error("two targets of one message share an id")
	}
	// The separator keeps (id, target) pairs apart that concatenate alike.
	if EventID("a", "bc") == EventID("ab", "c") {
		t.Error("ids collide without the separator")
	}
}

func message(id, body string) *extract.Message {
	m := extract.NewMessage(source.Message{Body: []byte(body)})
	m.ID = id
	return m
}

func TestWriterRow(t *testing.T) {
	emit := &config.Emit{NATSJetStream: &config.EmitJetStream{URL: "nats://x:4222", Subject: "out"}}
	key, err := extract.CompileExtractor(config.Extractor{JSONPath: "$.orderId"})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"orderId":"o-7","status":"paid","version":3}`

	w, err := NewWriter(emit, &key)
	if err != nil {
		t.Fatal(err)
	}
	row, err := w.Row(message("m1", body))
	if err != nil {
		t.Fatal(err)
	}
	if string(row.Payload) != body {
		t.Errorf("default payload %s, want the incoming one", row.Payload)
	}
	if row.EventID != EventID("m1", "natsJetStream:out") || row.SourceID != "m1" {
		t.Errorf("row ids %+v", row)
	}
	// One key, one shard, whatever the message id.
	other, _ := w.Row(message("m2", body))
	if row.Shard != Shard("o-7") || other.Shard != row.Shard || row.Shard < 0 || row.Shard >= inbox.OutboxShards {
		t.Errorf("shards %d and %d, want both %d", row.Shard, other.Shard, Shard("o-7"))
	}

	emit.Payload = map[string]string{"order": "$.orderId", "v": "$.version", "from": "@messageId"}
	w, err = NewWriter(emit, nil)
	if err != nil {
		t.Fatal(err)
	}
	row, err = w.Row(message("m1", body))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(row.Payload, &got); err != nil {
		t.Fatalf("payload %s is not JSON: %v", row.Payload, err)
	}
	if got["order"] != "o-7" || got["v"] != float64(3) || got["from"] != "m1" || len(got) != 3 {
		t.Errorf("payload %s", row.Payload)
	}
	if row.Shard != Shard("m1") {
		t.Errorf("without an entity key the shard follows the message id")
	}
	if _, err := w.Row(message("m3", `{"status":"x"}`)); err == nil {
		t.Error("a payload field missing from the message must be an error (the message's own fault)")
	}
}

func TestWriterHeadersAndOrderKey(t *testing.T) {
	emit := &config.Emit{NATSJetStream: &config.EmitJetStream{URL: "nats://x:4222", Subject: "out"},
		Headers: map[string]string{"Order-Status": "$.status", "Source-Id": "@messageId"}}
	key, err := extract.CompileExtractor(config.Extractor{JSONPath: "$.orderId"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(emit, &key)
	if err != nil {
		t.Fatal(err)
	}
	row, err := w.Row(message("m1", `{"orderId":"o-7","status":"paid"}`))
	if err != nil {
		t.Fatal(err)
	}
	if row.Headers["Order-Status"] != "paid" || row.Headers["Source-Id"] != "m1" || len(row.Headers) != 2 {
		t.Errorf("headers %v", row.Headers)
	}
	if row.OrderKey != "o-7" {
		t.Errorf("order key %q, want the entity key o-7", row.OrderKey)
	}
	if _, err := w.Row(message("m2", `{"orderId":"o-7"}`)); err == nil {
		t.Error("a header whose field is missing must be an error (the message's own fault)")
	}
	emit.Headers["Bad"] = "status"
	if _, err := NewWriter(emit, nil); err == nil {
		t.Error("an invalid header expression must not compile")
	}
}

func TestHTTPWriter(t *testing.T) {
	h := &config.HTTP{URL: "http://127.0.0.1:1/orders", Method: "POST", Delivery: config.HTTPOutbox}
	w := NewHTTPWriter(h, nil)
	body := `{"id":"m1"}`
	row, err := w.Row(message("m1", body))
	if err != nil {
		t.Fatal(err)
	}
	if string(row.Payload) != body || row.SourceID != "m1" || row.EventID != EventID("m1", "http:POST http://127.0.0.1:1/orders") {
		t.Errorf("row %+v", row)
	}
	if row.OrderKey != "" || row.Shard != Shard("m1") {
		t.Errorf("without an entity key: order key %q shard %d, want none and the id's shard", row.OrderKey, row.Shard)
	}
	if _, err := w.Row(message("m2", `not json`)); err == nil {
		t.Error("a payload that is not JSON must be refused, as the inline http effect does")
	}
}

// The failure rules of the relay: a refusal dead-letters at once, a
// retryable failure counts, an outage counts only when the target answered
// another event of the batch, and what was not attempted keeps its place.
func TestClassifyFailures(t *testing.T) {
	rejected := fmt.Errorf("%w: 422", ErrRejected)
	retry := fmt.Errorf("%w: 500", ErrRetryable)
	down := errors.New("connection refused")
	cases := []struct {
		name    string
		results []error
		want    string
	}{
		{"all ok", []error{nil, nil}, "rejected=[] counted=[] uncounted=[] first=<nil>"},
		{"target down", []error{down, errNotAttempted, down}, "rejected=[] counted=[] uncounted=[0 2] first=connection refused"},
		{"down while others answered", []error{nil, down}, "rejected=[] counted=[1] uncounted=[] first=connection refused"},
		{"retryable counts alone", []error{retry, down}, "rejected=[] counted=[0 1] uncounted=[] first=" + retry.Error()},
		{"refusal", []error{rejected, nil, errNotAttempted}, "rejected=[0] counted=[] uncounted=[] first=<nil>"},
	}
	for _, c := range cases {
		f := classifyFailures(c.results)
		got := fmt.Sprintf("rejected=%v counted=%v uncounted=%v first=%v", f.rejected, f.counted, f.uncounted, f.first)
		if got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}
