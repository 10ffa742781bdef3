package integration

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// settleRun is one outageRun of issue 33's: a broker, its database and the
// scenario.
type settleRun struct {
	name   string
	b      broker
	db     sinkDB
	dsnEnv string
	sc     outageScenario
}

func (r settleRun) run(t *testing.T, bin string) {
	t.Run(r.name, func(t *testing.T) {
		// Mostly waiting out the outage: together they take as long as one.
		t.Parallel()
		outageRun(t, bin, r.b, r.db, r.dsnEnv, r.sc)
	})
}

// newSettleRun creates the run's database; call it before the subtests go
// parallel (dsnEnvFor calls t.Setenv).
func newSettleRun(t *testing.T, name string, b broker, sc outageScenario) settleRun {
	db := newDatabase(t)
	db.createEffects(t)
	return settleRun{name: name, b: b, db: db, dsnEnv: dsnEnvFor(t, db), sc: sc}
}

// consumerRecreatedDuringTheOutage is issue 33's first per-broker proof:
// the replica dies between COMMIT and ack (the failpoint), the consumer or
// group it consumed from is deleted and created again while it is down,
// the outage lasts over 4× the derived window, prune runs, and nothing is
// applied twice. A reading of the new consumer proves nothing about the
// old one's claims.
//
//   - JetStream: a workqueue stream (the setup); the new durable
//     reports nothing pending while the stream stores every message the
//     gone one never acknowledged. Without the fix: 200 of 300 twice.
//   - Kafka (kfake, in-process, over the Kafka protocol on loopback): the
//     group is deleted once the dead member's session expired (a group
//     with members cannot be deleted); its committed offsets go with it,
//     so the settlement floors at the log start and holds by itself: this
//     one passed before the fix too, Kafka's reading was already evidence.
//   - RabbitMQ: "the consumer" is the queue. Re-created, it has lost its
//     messages, so nothing can be redelivered; what can still bring them
//     back is a restore, so the same 300 messages are published again: the
//     queue holds them and the job holds for them (it did before the fix
//     too; a missing counter is unknown, never 0, and an ack count below
//     the stamp's is a reset: TestEvidenceAboutTheConsumer, since the
//     management API reports ack 0 for a re-created queue with publishes).
//   - Redis: the group is destroyed and created again at 0; it has nothing
//     pending and no creation time. Without the fix the first reading
//     retired the gone replica and the redelivery applied every committed
//     id twice.
func consumerRecreatedDuringTheOutage(t *testing.T, bin string) {
	js := newJetStreamRetention(t, 2*time.Second, jetstream.WorkQueuePolicy)
	k := kafkaKeepingRecords(t, newKafka(t, 3))
	rb := newRabbitMQ(t)
	rd := newRedis(t, time.Second)
	runs := []settleRun{
		newSettleRun(t, "NATSJetStream", js, outageScenario{gone: js.recreate, reason: []string{"proves nothing", "workqueue"}}),
		newSettleRun(t, "Kafka", k, outageScenario{gone: k.deleteGroup}),
		newSettleRun(t, "RabbitMQ", rb, outageScenario{gone: rb.restoreRecreated, reason: []string{"ready 300"}}),
		newSettleRun(t, "RedisStreams", rd, outageScenario{gone: rd.recreateGroup, reason: []string{"not delivered yet"}}),
	}
	for _, r := range runs {
		r.run(t, bin)
	}
}

// acksLostOnAHalfOpenConnection is issue 33's second per-broker proof: the
// runtime reaches the broker through a blackhole that turns half-open at
// its first acknowledgement (every byte after it, both ways, is dropped
// and nothing is closed), commits, and is stopped with SIGTERM, or killed
// with SIGKILL once a heartbeat was written after the acks were lost. Over
// 4× the window later, prune runs; then the consumer comes back directly
// and nothing is applied twice.
//
//   - JetStream and RabbitMQ acks get no reply, so only a confirming round
//     trip after them counts (without the fix: 300 of 300 twice on
//     JetStream with SIGTERM, a graceful stop recorded; with SIGKILL the
//     heartbeats cleared the anchor).
//   - Kafka's commit and Redis's XACK wait for the broker's answer, which
//     never comes: the Ack fails, and the claims hold until the broker
//     proves them settled (they held for 10 minutes before the fix, which
//     this test's outage is shorter than: it passed before the fix too).
func acksLostOnAHalfOpenConnection(t *testing.T, bin string) {
	var runs []settleRun
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		js := newJetStream(t, 2*time.Second)
		jsHole := newBlackhole(t, strings.TrimPrefix(natsURL, "nats://"))
		jsSrc := js.sourceConfig()
		jsSrc.NATSJetStream.URL = "nats://" + jsHole.addr()

		k, kHole := newKafkaBehindBlackhole(t, 3)
		kafkaKeepingRecords(t, k)

		rb := newRabbitMQ(t)
		rbHole := newBlackhole(t, "127.0.0.1:5672")
		env := fmt.Sprintf("IDC_INTEGRATION_AMQP_URI_HOLE_%d", sig)
		t.Setenv(env, "amqp://guest:guest@"+rbHole.addr()+"/")
		rbSrc := rb.sourceConfig()
		rbSrc.RabbitMQ.URIEnv = env

		rd := newRedis(t, time.Second)
		rdHole := newBlackhole(t, redisAddr)
		rdSrc := rd.sourceConfig()
		rdSrc.RedisStreams.Address = rdHole.addr()

		kSrc := k.sourceConfig()
		name := map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGKILL: "SIGKILL"}[sig]
		runs = append(runs,
			newSettleRun(t, "NATSJetStream/"+name, js, outageScenario{first: &jsSrc, down: halfOpen(jsHole, natsAck, sig)}),
			newSettleRun(t, "Kafka/"+name, k, outageScenario{first: &kSrc, down: halfOpen(kHole, kafkaAck, sig)}),
			newSettleRun(t, "RabbitMQ/"+name, rb, outageScenario{first: &rbSrc, down: halfOpen(rbHole, amqpAck, sig)}),
			newSettleRun(t, "RedisStreams/"+name, rd, outageScenario{first: &rdSrc, down: halfOpen(rdHole, redisAck, sig)}),
		)
	}
	for _, r := range runs {
		r.run(t, bin)
	}
}

// halfOpen publishes, runs the runtime through hole until its first
// acknowledgement turns the connection half-open, waits for a committed
// batch and heartbeats written for longer than retention.AnchorSlack after
// it, and stops the runtime with sig.
// The dead connection is closed once the process is gone.
// It reads PostgreSQL's progress records: these runs are on PostgreSQL.
func halfOpen(hole *blackhole, match func() func([]byte) bool, sig syscall.Signal) func(*testing.T, string, *config.Config, sinkDB, func()) {
	return func(t *testing.T, bin string, cfg *config.Config, sdb sinkDB, publish func()) {
		db, ok := sdb.(*database)
		if !ok {
			t.Fatalf("halfOpen runs on PostgreSQL, not on %s", sdb.dialect())
		}
		hole.halfOpenAt(match)
		publish()
		p := startBinary(t, bin, cfg)
		select {
		case <-hole.fired:
		case <-time.After(60 * time.Second):
			t.Fatalf("the runtime sent no acknowledgement in 60s\n%s", p.logs.String())
		}
		lost := time.Now()
		// Heartbeats for longer than the anchor's slack after the acks were
		// lost: a replica that took its unconfirmed acks for done has moved
		// its anchor past those claims by then.
		after := lost.Add(retention.AnchorSlack + 2*time.Second)
		waitFor(t, 30*time.Second, "a committed batch and heartbeats for longer than the anchor's slack after its acknowledgements were lost", func() error {
			n := db.queryInt(t, "SELECT count(*) FROM app.effects")
			hb := db.queryInt(t, "SELECT count(*) FROM app.inbox_orders_progress WHERE heartbeat_at > $1", after)
			if n == 0 || hb == 0 {
				return fmt.Errorf("%d effects, %d heartbeats since", n, hb)
			}
			return nil
		})
		unacked := db.queryInt(t, "SELECT count(*) FROM app.inbox_orders_progress WHERE unacked_since IS NOT NULL")
		t.Logf("acknowledgements lost on the half-open connection (%d bytes dropped); progress records with unacknowledged claims: %d; sending %s",
			hole.dropped.Load(), unacked, sig)
		if err := p.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		st := p.wait(t, 150*time.Second)
		hole.cut()
		var since, hb time.Time
		var stopped bool
		if err := db.pool.QueryRow(context.Background(), "SELECT coalesce(unacked_since, 'epoch'), heartbeat_at, stopped FROM app.inbox_orders_progress ORDER BY heartbeat_at DESC LIMIT 1").Scan(&since, &hb, &stopped); err != nil {
			t.Fatal(err)
		}
		t.Logf("runtime exited: %s; its last progress record: heartbeat %s, unacknowledged since %s (acks lost at %s), stopped=%t",
			st, hb.Format(time.RFC3339Nano), since.Format(time.RFC3339Nano), lost.Format(time.RFC3339Nano), stopped)
	}
}

// newJetStreamRetention is newJetStream on a stream of the given retention
// policy.
func newJetStreamRetention(t *testing.T, ackWait time.Duration, policy jetstream.RetentionPolicy) *jetStreamBroker {
	t.Helper()
	b := newJetStream(t, ackWait)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A workqueue stream takes one consumer: the stream is made again with
	// the policy (the retention of a stream cannot be changed).
	if err := b.js.DeleteStream(ctx, b.stream); err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: b.stream, Subjects: []string{b.subject + ".>"}, Retention: policy}); err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	b.ackWait = ackWait
	if _, err := b.js.CreateConsumer(ctx, b.stream, b.consumerConfig()); err != nil {
		t.Fatalf("creating consumer: %v", err)
	}
	return b
}

func (b *jetStreamBroker) consumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{Durable: b.consumer, AckPolicy: jetstream.AckExplicitPolicy, AckWait: b.ackWait, MaxAckPending: 10000}
}

// recreate deletes the durable and creates it again with the same config.
func (b *jetStreamBroker) recreate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.js.DeleteConsumer(ctx, b.stream, b.consumer); err != nil {
		t.Fatalf("deleting the durable: %v", err)
	}
	c, err := b.js.CreateConsumer(ctx, b.stream, b.consumerConfig())
	if err != nil {
		t.Fatalf("creating the durable again: %v", err)
	}
	info := c.CachedInfo()
	t.Logf("JetStream durable %s re-created at %s: %d ack pending, %d pending", b.consumer, info.Created.Format(time.RFC3339Nano), info.NumAckPending, info.NumPending)
}

// deleteGroup deletes the Kafka group (and its committed offsets) once the
// dead member's session expired.
func (b *kafkaBroker) deleteGroup(t *testing.T) {
	adm := kadm.NewClient(b.cl)
	waitFor(t, 90*time.Second, "the empty group to be deleted", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := adm.DeleteGroup(ctx, b.group)
		if err == nil {
			err = resp.Err
		}
		return err
	})
	t.Logf("Kafka group %s deleted", b.group)
}

// restoreRecreated deletes the queue, declares it again and publishes the
// same messages again, as a restore would.
func (b *rabbitBroker) restoreRecreated(t *testing.T) {
	if _, err := b.ch.QueueDelete(b.queue, false, false, false); err != nil {
		t.Fatalf("deleting the queue: %v", err)
	}
	if _, err := b.ch.QueueDeclare(b.queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatalf("declaring the queue again: %v", err)
	}
	var msgs []outgoing
	for _, e := range plainEvents(outageMessages) {
		msgs = append(msgs, e.outgoing())
	}
	b.publish(t, msgs)
	t.Logf("RabbitMQ queue %s re-created and the %d messages published again", b.queue, len(msgs))
}

// recreateGroup destroys the group and creates it again at 0.
func (b *redisBroker) recreateGroup(t *testing.T) {
	ctx := context.Background()
	if err := b.rdb.XGroupDestroy(ctx, b.stream, b.group).Err(); err != nil {
		t.Fatalf("XGROUP DESTROY: %v", err)
	}
	if err := b.rdb.XGroupCreate(ctx, b.stream, b.group, "0").Err(); err != nil {
		t.Fatalf("XGROUP CREATE: %v", err)
	}
	t.Logf("Redis group %s destroyed and created again at 0", b.group)
}

// newKafkaBehindBlackhole is newKafka whose broker advertises a
// blackhole's address, so every client (the runtime's, the test's, the
// prune job's) goes through it.
func newKafkaBehindBlackhole(t *testing.T, partitions int32) (*kafkaBroker, *blackhole) {
	t.Helper()
	hole := newBlackhole(t, "")
	b := &kafkaBroker{topic: uniqueName("idc-it"), group: uniqueName("idc-it-group")}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, b.topic),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			ln, err := net.Listen(network, address)
			if err != nil {
				return nil, err
			}
			hole.setTarget(ln.Addr().String())
			return addrListener{Listener: ln, addr: hole.ln.Addr()}, nil
		}))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	b.cluster = c
	if b.cl, err = kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.cl.Close)
	return b, hole
}
