package integration

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// TestPipelineEmitTargets runs stage A (JetStream -> upsert + emit) into
// each other emit target, Kafka (franz-go's in-process kfake cluster, the
// only Kafka here), RabbitMQ (the default exchange routing to a queue) and
// Redis Streams, with the first relay killed between publish and mark-sent.
// None of these brokers drops the republished batch, so stage B (that
// target -> append, message.id.header: Idc-Event-Id) must: one row per
// original order.
func TestPipelineEmitTargets(t *testing.T) {
	targets := []func(t *testing.T) (broker, *config.Emit){
		func(t *testing.T) (broker, *config.Emit) {
			b := newKafka(t, 3)
			return b, &config.Emit{Kafka: &config.EmitKafka{BootstrapServers: b.cluster.ListenAddrs(), Topic: b.topic}}
		},
		func(t *testing.T) (broker, *config.Emit) {
			b := newRabbitMQ(t)
			return b, &config.Emit{RabbitMQ: &config.EmitRabbitMQ{URIEnv: amqpURIEnv, RoutingKey: b.queue}}
		},
		func(t *testing.T) (broker, *config.Emit) {
			b := newRedis(t, time.Second)
			return b, &config.Emit{RedisStreams: &config.EmitRedisStreams{Address: redisAddr, Stream: b.stream}}
		},
	}
	for _, target := range targets {
		out, emit := target(t)
		t.Run(out.name(), func(t *testing.T) { pipelineInto(t, out, emit) })
	}
}

func pipelineInto(t *testing.T, out broker, emit *config.Emit) {
	const unique = 400
	in := newJetStream(t, 2*time.Second)
	db := newPipelineDatabase(t)
	a := stageAConfig(in.sourceConfig(), dsnEnvFor(t, db), "unused", config.EmitAlways)
	emit.Payload, emit.When = a.Emit.Payload, a.Emit.When
	emit.Headers = map[string]string{"Order-Version": "$.version"}
	a.Emit = emit
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	b := stageBConfig(out.sourceConfig(), a.Sink.DSNEnv)
	b.Message.ID = config.Extractor{Header: config.EventIDHeader}
	b.Sink.Effect.Append.Columns["hdr"] = "@header:Order-Version"
	migrateInbox(t, db, a)
	migrateInbox(t, db, b)
	msgs := withDuplicates(keyedEvents(unique, 25), dupShare, rand.New(rand.NewPCG(7, 8)))
	in.publish(t, msgs)

	stageA := startRunner(t, a, db, "stage-a")
	var batches atomic.Int32
	killed := errors.New("killed between publish and mark-sent")
	first := startRelay(t, a, db, func() error {
		if batches.Add(1) == 2 {
			return killed
		}
		return nil
	})
	if err := first.wait(t); !errors.Is(err, killed) {
		t.Fatalf("first relay ended with %v, want the injected kill", err)
	}
	if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_projector_outbox WHERE sent_at IS NULL"); n == 0 {
		t.Fatal("the killed relay left no unsent row")
	}
	second := startRelay(t, a, db, nil)
	waitFor(t, 60*time.Second, "stage A to settle and its outbox to drain", func() error {
		if s := stageA.settled(); s < len(msgs) {
			return fmt.Errorf("stage A settled %d", s)
		}
		if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_projector_outbox WHERE sent_at IS NULL"); n != 0 {
			return fmt.Errorf("%d outbox rows unsent", n)
		}
		return nil
	})
	second.stop(t)
	stageA.stop(t)
	published := int(testutilPublished(first) + testutilPublished(second))

	stageB := startRunner(t, b, db, "stage-b")
	waitFor(t, 60*time.Second, "stage B to apply every order", func() error {
		if n := db.queryInt(t, "SELECT count(DISTINCT source_id) FROM app.projected"); n < unique {
			return fmt.Errorf("%d of %d orders", n, unique)
		}
		if stageB.duplicates() == 0 {
			return errors.New("no duplicate skipped yet: the republished batch has not come through")
		}
		return nil
	})
	stageB.stop(t)
	rows := db.queryInt(t, "SELECT count(*) FROM app.projected")
	ids := db.queryInt(t, "SELECT count(DISTINCT source_id) FROM app.projected")
	t.Logf("PIPELINE target=%s kills=1 marked=%d unique=%d final=%d doubled=%d lost=%d duplicatesSkippedByB=%d",
		out.name(), published, unique, ids, rows-ids, unique-ids, stageB.duplicates())
	if rows != unique || ids != unique {
		t.Errorf("stage B: %d rows over %d original ids, want exactly %d, one each", rows, ids, unique)
	}
	if n := db.queryInt(t, "SELECT count(*) FROM app.projected WHERE hdr IS DISTINCT FROM version::text"); n != 0 {
		t.Errorf("%d rows whose Order-Version header (emit.headers) is not the event's version", n)
	}
	if published != unique {
		t.Errorf("the relays marked %d events sent, want each of the %d outbox rows once", published, unique)
	}
}
