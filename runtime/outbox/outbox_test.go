package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
