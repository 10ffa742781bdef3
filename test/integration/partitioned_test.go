package integration

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// TestPartitionedConsumers runs the scale-out docs/tune.md describes for
// shared keys: the stream partitioned by key (<subject>.<partition>.<key>,
// as a NATS subject mapping with partition() produces), one consumer per
// partition with its own durable consumer filtered to it and its own inbox,
// both upserting one table through the sequence gate. Every message,
// duplicates included, is settled by the consumer of its key's partition;
// each inbox holds exactly its partition's ids; the table ends at every
// key's highest version and no row change went backwards.
func TestPartitionedConsumers(t *testing.T) {
	const keys, versions, parts = 60, 20, 2
	b := newJetStream(t, 30*time.Second)
	db := newDatabase(t)
	createGatedOrders(t, db)
	dsnEnv := dsnEnvFor(t, db)
	partition := func(key string) int {
		h := fnv.New32a()
		_, _ = h.Write([]byte(key))
		return int(h.Sum32() % parts)
	}

	rng := rand.New(rand.NewPCG(11, 12))
	var events []event
	for k := range keys {
		for v := 1; v <= versions; v++ {
			events = append(events, event{ID: fmt.Sprintf("k%02d-v%02d", k, v), Key: fmt.Sprintf("k%02d", k), Version: v, Status: fmt.Sprintf("s%02d", v)})
		}
	}
	rng.Shuffle(len(events), func(i, j int) { events[i], events[j] = events[j], events[i] })
	msgs := withDuplicates(events, 0.1, rng)
	idsIn := make([]map[string]bool, parts)
	for p := range idsIn {
		idsIn[p] = map[string]bool{}
	}
	for _, m := range msgs {
		var e event
		if err := json.Unmarshal(m.body, &e); err != nil {
			t.Fatal(err)
		}
		p := partition(e.Key)
		idsIn[p][e.ID] = true
		if _, err := b.js.PublishAsync(fmt.Sprintf("%s.%d.%s", b.subject, p, e.Key), m.body); err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishing did not complete in 30s")
	}
	for p := range parts {
		if len(idsIn[p]) == 0 {
			t.Fatalf("partition %d got no message: the test would not exercise two consumers", p)
		}
	}

	runners := make([]*runner, parts)
	for p := range parts {
		cfg := appendConfig(config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: b.stream,
			Consumer: fmt.Sprintf("orders_p%d", p), FilterSubject: fmt.Sprintf("%s.%d.*", b.subject, p)}}, dsnEnv)
		cfg.Sink.InboxTable = fmt.Sprintf("inbox_orders_p%d", p)
		gateOrders(cfg)
		cfg.Delivery.BatchSize = 40
		migrateInbox(t, db, cfg)
		runners[p] = startRunner(t, cfg, db, fmt.Sprintf("partition-%d", p))
	}
	waitSettled(t, len(msgs), 60*time.Second, runners...)
	dups := 0
	for _, r := range runners {
		r.stop(t)
		dups += r.duplicates()
	}

	wrong := db.queryInt(t, "SELECT count(*) FROM app.orders WHERE version <> $1 OR status <> $2", versions, fmt.Sprintf("s%02d", versions))
	if n := db.queryInt(t, "SELECT count(*) FROM app.orders"); n != keys || wrong != 0 {
		t.Errorf("%d rows, %d not at version %d: want every key at its highest version", n, wrong, versions)
	}
	if back := db.queryInt(t, "SELECT count(*) FROM app.changes WHERE old_version >= new_version"); back != 0 {
		t.Errorf("%d row changes went backwards or sideways through the gate", back)
	}
	for p, r := range runners {
		if got := r.settled(); got == 0 {
			t.Errorf("partition %d's consumer settled nothing", p)
		}
		inbox := fmt.Sprintf("app.inbox_orders_p%d", p)
		if n := db.queryInt(t, "SELECT count(*) FROM "+inbox); n != len(idsIn[p]) {
			t.Errorf("%s holds %d ids, want the %d unique ids of partition %d", inbox, n, len(idsIn[p]), p)
		}
		for q := range parts {
			if q == p {
				continue
			}
			ids := make([]string, 0, len(idsIn[q]))
			for id := range idsIn[q] {
				ids = append(ids, id)
			}
			if n := db.queryInt(t, "SELECT count(*) FROM "+inbox+" WHERE message_id = ANY($1)", ids); n != 0 {
				t.Errorf("%s holds %d ids of partition %d: a partition's consumer read another's messages", inbox, n, q)
			}
		}
	}
	if want := len(msgs) - len(events); dups != want {
		t.Errorf("duplicates skipped = %d over the partitions, want %d", dups, want)
	}
	t.Logf("%d messages (%d duplicates) over %d partitions: %d and %d unique ids", len(msgs), len(msgs)-len(events), parts, len(idsIn[0]), len(idsIn[1]))
}
