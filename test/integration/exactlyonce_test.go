package integration

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/consumer"
)

const (
	// uniqueEvents and dupShare: 2000 messages, 20% of them re-sent
	// duplicates (same id, a new broker message).
	uniqueEvents = 1600
	dupShare     = 0.2
	// crashAtCommit is the committed batch after which replica A dies.
	crashAtCommit = 3
)

// TestExactlyOnceEffectPerSource runs, for each source: 2000 messages of
// which 20% are duplicates; replica A commits three batches and dies
// between the third commit and its ack; replica B (a fresh process on the
// same durable consumer / group / queue) receives the unacknowledged batch
// again and finishes. Exactly one effect per id, every message acked.
func TestExactlyOnceEffectPerSource(t *testing.T) {
	brokers := []func(t *testing.T) broker{
		// AckWait 2s: JetStream redelivers the abandoned batch after it.
		func(t *testing.T) broker { return newJetStream(t, 2*time.Second) },
		func(t *testing.T) broker { return newKafka(t, 3) },
		func(t *testing.T) broker { return newRabbitMQ(t) },
		// Replica B has another consumer name, so it takes A's pending
		// entries over with XAUTOCLAIM once they idled 1s (the lease).
		func(t *testing.T) broker { return newRedis(t, time.Second) },
	}
	for _, newBroker := range brokers {
		b := newBroker(t)
		t.Run(b.name(), func(t *testing.T) { exactlyOnceWithCrash(t, b) })
	}
}

func exactlyOnceWithCrash(t *testing.T, b broker) {
	db := newDatabase(t)
	db.exec(t, "CREATE SCHEMA app", effectsTable)
	cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
	migrateInbox(t, db, cfg)
	msgs := withDuplicates(plainEvents(uniqueEvents), dupShare, rand.New(rand.NewPCG(1, 2)))
	b.publish(t, msgs)

	var commits atomic.Int32
	consumer.AfterCommitHook = func() {
		if commits.Add(1) == crashAtCommit {
			panic(crashed{})
		}
	}
	t.Cleanup(func() { consumer.AfterCommitHook = nil })
	a := startRunner(t, cfg, db, "replica-a")
	a.waitCrash(t)
	consumer.AfterCommitHook = nil
	inDoubt, _ := a.src.snapshot()
	if len(inDoubt) == 0 {
		t.Fatal("replica A crashed with no batch in flight")
	}
	committedByA := db.queryInt(t, "SELECT count(*) FROM app.effects")
	// The crashed batch and whatever other lanes committed before the crash
	// stopped them: committed, never acknowledged.
	committedInDoubt := db.queryInt(t, "SELECT count(DISTINCT message_id) FROM app.effects WHERE message_id = ANY($1)", inDoubt)
	if committedInDoubt == 0 {
		t.Fatal("replica A crashed after a commit, yet none of its unacknowledged messages is committed")
	}

	bb := startRunner(t, cfg, db, "replica-b")
	// A acknowledged (and counted) only its first batches; every other
	// message, the abandoned batch included, is settled by B.
	waitSettled(t, len(msgs)-a.settled(), 60*time.Second, bb)
	// The count alone is not the end: a message A settled can come to B
	// again (a Kafka commit refused by a rebalance, A's last acks lost in
	// the crash) and count twice. B stops when the broker says it holds
	// nothing unacknowledged.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	waitFor(t, 30*time.Second, b.name()+" to report every message acknowledged while replica B runs", func() error { return b.drained(ctx) })
	bb.stop(t)

	checkExactlyOnce(t, db, b, uniqueEvents)
	_, delivered := bb.src.snapshot()
	for _, id := range inDoubt {
		if delivered[id] == 0 {
			t.Fatalf("%s: id %s of the batch committed but not acknowledged was never redelivered", b.name(), id)
		}
	}
	if bb.duplicates() < committedInDoubt {
		t.Errorf("%s: replica B skipped %d duplicates, want at least the %d redelivered committed messages",
			b.name(), bb.duplicates(), committedInDoubt)
	}
	t.Logf("%s: %d messages (%d unique); A committed %d effects and crashed with %d unacknowledged; B skipped %d duplicates",
		b.name(), len(msgs), uniqueEvents, committedByA, len(inDoubt), bb.duplicates())
}
