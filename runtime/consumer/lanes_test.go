package consumer

import (
	"fmt"
	"testing"

	"github.com/go-logr/logr"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// split puts every message of one entity key on one lane (two in-flight
// transactions never touch one key) in fetch order, a repeated id on the
// lane of its first occurrence, and a message without an id on some lane
// as a dead letter: every message is acknowledged by exactly one lane.
func TestSplitKeepsKeysOnOneLaneInOrder(t *testing.T) {
	cfg := testConfig(t, config.LayoutTable)
	cfg.Message.Entity = &config.Entity{Key: config.Extractor{JSONPath: "$.k"}, Sequence: config.Extractor{JSONPath: "$.n"}}
	cfg.Delivery.InFlight = 4
	c, err := New(newFakeSource(nil), postgres.DB{}, cfg, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	var msgs []source.Message
	for i := range 400 {
		msgs = append(msgs, message(fmt.Sprintf("n%d", i), fmt.Sprintf(`{"id":"id-%d","k":"key-%d","n":%d}`, i, i%37, i)))
	}
	// id-399 repeated at once (same batch: a duplicate), id-5 much later (a
	// later batch: claimed again, the inbox decides).
	msgs = append(msgs, message("dup", `{"id":"id-399","k":"key-29","n":399}`), message("late", `{"id":"id-5","k":"key-5","n":5}`),
		message("noid", `{"k":"key-1"}`))
	cfg.Delivery.BatchSize = 37
	perLane := c.split(msgs, cfg.Delivery.InFlight)
	var lanes []laneBatch
	var laneIdx []int
	for i, batches := range perLane {
		for _, lb := range batches {
			if len(lb.msgs) > cfg.Delivery.BatchSize {
				t.Fatalf("lane %d: a batch of %d messages, more than batchSize %d", i, len(lb.msgs), cfg.Delivery.BatchSize)
			}
			lanes = append(lanes, lb)
			laneIdx = append(laneIdx, i)
		}
	}
	seq := extract.MustCompile("$.n")
	keyLane := map[string]int{}
	lastSeq := map[string]int64{}
	acked, used, dls, dups := 0, 0, 0, 0
	for j, lb := range lanes {
		lane := laneIdx[j]
		acked += len(lb.msgs)
		dls += len(lb.dls)
		dups += lb.dups
		if len(lb.recs) > 0 {
			used++
		}
		for _, m := range lb.recs {
			k, err := c.key.Text(m)
			if err != nil {
				t.Fatal(err)
			}
			if prev, ok := keyLane[k]; ok && prev != lane {
				t.Fatalf("key %s on lanes %d and %d", k, prev, lane)
			}
			keyLane[k] = lane
			n, err := seq.Int(m)
			if err != nil {
				t.Fatal(err)
			}
			if m.NativeID != "late" && n <= lastSeq[k] && lastSeq[k] != 0 {
				t.Fatalf("key %s: sequence %d after %d on lane %d", k, n, lastSeq[k], lane)
			}
			lastSeq[k] = n
		}
	}
	if acked != len(msgs) || dls != 1 || dups != 1 || len(keyLane) != 37 {
		t.Errorf("acked %d of %d, %d dead letters (want 1), %d duplicates (want 1), %d keys (want 37)", acked, len(msgs), dls, dups, len(keyLane))
	}
	if used < 2*cfg.Delivery.InFlight {
		t.Errorf("402 messages in batches of at most 37 over 4 lanes gave only %d batches", used)
	}
}

// Merging a lane's queued batch keeps every message to acknowledge and
// turns an id already in the batch into a duplicate (applied once).
func TestJoinTreatsRepeatedIdsAsDuplicates(t *testing.T) {
	cfg := testConfig(t, config.LayoutTable)
	c, err := New(newFakeSource(nil), postgres.DB{}, cfg, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	a := c.split([]source.Message{message("n1", `{"id":"a","n":1}`), message("n2", `{"id":"b","n":2}`)}, 1)[0][0]
	b := c.split([]source.Message{message("n3", `{"id":"b","n":2}`), message("n4", `{"id":"c","n":3}`), message("n5", `{"n":4}`)}, 1)[0][0]
	j := a.join(b)
	var ids []string
	for _, m := range j.recs {
		ids = append(ids, m.ID)
	}
	if fmt.Sprint(ids) != "[a b c]" || j.dups != 1 || len(j.msgs) != 5 || len(j.dls) != 1 {
		t.Errorf("joined: ids %v, %d duplicates, %d to ack, %d dead letters; want [a b c], 1, 5, 1", ids, j.dups, len(j.msgs), len(j.dls))
	}
}
