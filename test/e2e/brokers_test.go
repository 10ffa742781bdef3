package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// jetStreamOrders: the orders sample (JetStream -> upsert behind the
// sequence gate) on the node; producer retries, later re-sends and versions
// out of order give exactly one effect per id and the latest state per order.
func (s *suite) jetStreamOrders(ctx context.Context, t *testing.T) {
	setup := localcluster.OrdersSetup{
		Namespace: testNamespace, Name: "orders-projector", Stream: "IDC_E2E_" + strings.ToUpper(s.suffix),
		Subject: "idc-e2e-" + s.suffix + ".orders", Secret: "orders-db", Replicas: 2,
	}
	idc, err := localcluster.LoadOrdersSample(setup)
	if err != nil {
		t.Fatal(err)
	}
	db := s.dbName()
	dsn, err := localcluster.PrepareOrdersDatabase(ctx, db, idc)
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() {
		if !t.Failed() {
			_ = localcluster.DropDatabase(context.Background(), db)
		}
	})
	if err := s.prepareSchema(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	nc, js, err := localcluster.ConnectJetStream()
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(nc.Close)
	if err := localcluster.RecreateOrdersStream(ctx, js, setup.Stream, setup.Subject); err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() { _ = js.DeleteStream(context.Background(), setup.Stream) })
	if err := s.c.Client.Create(ctx, localcluster.OrdersSecret(idc, localcluster.PodDSN(dsn))); err != nil {
		t.Fatal(err)
	}
	if err := s.c.Client.Create(ctx, idc); err != nil {
		t.Fatal(err)
	}
	s.orders = s.waitReady(ctx, t, idc, 2)

	w := localcluster.NewWorkload(60, 4, 0.4, 42)
	stats, err := w.Publish(ctx, js, setup.Subject, nil)
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := localcluster.WaitDrained(dctx, js, setup.Stream, setup.Name, nil); err != nil {
		t.Fatal(err)
	}
	out, err := w.Verify(ctx, dsn, idc)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("published %+v; outcome %+v", stats, out)
	if !out.OK() || out.DeadLetterRows != len(w.Poison) {
		t.Fatalf("not exactly one effect per id (dead letters %d, want %d): %+v", out.DeadLetterRows, len(w.Poison), out)
	}
	pods, err := s.c.ConsumerPods(ctx, idc)
	if err != nil {
		t.Fatal(err)
	}
	m, err := localcluster.Metrics(ctx, pods)
	if err != nil {
		t.Fatal(err)
	}
	if int(m["idc_messages_total"]) < stats.Stored || int(m["idc_duplicates_skipped_total"]) < len(w.Resends) {
		t.Fatalf("runtime metrics over the pods' IPs: %v; want >= %d messages and >= %d duplicates", m, stats.Stored, len(w.Resends))
	}
	t.Logf("runtime metrics scraped from the pod IPs: messages=%v duplicates=%v dead=%v", m["idc_messages_total"], m["idc_duplicates_skipped_total"], m["idc_dead_letters_total"])
}

func (s *suite) dbName() string { return "idc_e2e_" + s.suffix }

func (s *suite) dsn() string {
	dsn, _ := localcluster.DatabaseDSN(s.dbName())
	return dsn
}

// prepareSchema creates the append targets of the other resources: no
// unique constraint, so a message applied twice is a second row.
func (s *suite) prepareSchema(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	stmts := []string{"CREATE SCHEMA e2e"}
	for _, b := range []string{"ledger", "rabbitmq", "redis", "kafka", "retained", "dropped"} {
		stmts = append(stmts, fmt.Sprintf("CREATE TABLE e2e.events_%s (event_id text NOT NULL, num int NOT NULL)", b))
	}
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// appendManifest is an append resource of the test: one events row per
// applied message.
// batchSize is 200 unless the name says "jetstream-ledger" (the kill test
// keeps transactions small so that the kill lands mid-stream).
func appendManifest(name, table, source string, replicas int, extra string) string {
	batch := 200
	if name == "jetstream-ledger" {
		batch = 20
	}
	return fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: %s}
spec:
  source:
%s
  message:
    id: {jsonPath: $.eventId}
  sink:
    postgres: {connectionSecretRef: {name: e2e-db, key: dsn}, schema: e2e}
    inbox: {table: inbox_%s%s}
    effect:
      append: {table: %s, columns: {event_id: "@messageId", num: $.n}}
  delivery: {batchSize: %d, maxWait: 100ms}
  retention: {maxReplayAge: 48h}
  runtime: {replicas: %d}
`, name, source, strings.ReplaceAll(name, "-", "_"), extra, table, batch, replicas)
}

// events is a workload for an append resource: unique ids plus a share of
// re-sends of the same event, shuffled.
type events struct {
	unique []string
	sends  [][]byte
}

func newEvents(prefix string, n int, resend float64, seed uint64) *events {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	e := &events{}
	for i := range n {
		id := fmt.Sprintf("%s-%06d", prefix, i)
		body, _ := json.Marshal(map[string]any{"eventId": id, "n": i})
		e.unique = append(e.unique, id)
		e.sends = append(e.sends, body)
		if rng.Float64() < resend {
			e.sends = append(e.sends, body)
		}
	}
	rng.Shuffle(len(e.sends), func(i, j int) { e.sends[i], e.sends[j] = e.sends[j], e.sends[i] })
	return e
}

// tally is what the database says about an append table against the
// published ids: doubled = ids with more than one row, lost = ids with none
// and no dead letter.
type tally struct{ unique, rows, distinct, doubled, lost, phantom, deadLetters int }

func (s *suite) tally(ctx context.Context, table, inbox string, e *events) (tally, error) {
	conn, err := pgx.Connect(ctx, s.dsn())
	if err != nil {
		return tally{}, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	v := tally{unique: len(e.unique)}
	rows, err := conn.Query(ctx, "SELECT event_id, count(*) FROM "+pgx.Identifier{"e2e", table}.Sanitize()+" GROUP BY event_id")
	if err != nil {
		return v, err
	}
	seen := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return v, err
		}
		seen[id] = n
	}
	if err := rows.Err(); err != nil {
		return v, err
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{"e2e", inbox + "_dead_letters"}.Sanitize()).Scan(&v.deadLetters); err != nil {
		return v, err
	}
	want := map[string]bool{}
	for _, id := range e.unique {
		want[id] = true
		switch n := seen[id]; {
		case n == 0:
			v.lost++
		case n > 1:
			v.doubled++
		}
	}
	for id, n := range seen {
		v.rows += n
		v.distinct++
		if !want[id] {
			v.phantom++
		}
	}
	v.lost -= v.deadLetters
	return v, nil
}

func (v tally) ok() bool {
	return v.doubled == 0 && v.lost == 0 && v.phantom == 0 && v.deadLetters == 0 && v.distinct == v.unique && v.rows == v.unique
}

// waitApplied waits until every unique id has a row (or the timeout), then
// returns the tally.
func (s *suite) waitApplied(ctx context.Context, t *testing.T, table, inbox string, e *events, timeout time.Duration) tally {
	t.Helper()
	var v tally
	err := localcluster.Eventually(ctx, timeout, func() error {
		var err error
		if v, err = s.tally(ctx, table, inbox, e); err != nil {
			return err
		}
		if v.distinct < v.unique {
			return fmt.Errorf("%s: %d of %d ids applied", table, v.distinct, v.unique)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// everyBroker: one resource per broker (RabbitMQ, Redis Streams, Kafka on a
// kfake cluster the test serves on the bridge IP, and JetStream below in the
// kill test) goes Ready from kubelet-run pods and applies each id once.
func (s *suite) everyBroker(ctx context.Context, t *testing.T) {
	s.secret(ctx, t, "e2e-db", map[string]string{"dsn": localcluster.PodDSN(s.dsn())})
	// RabbitMQ's guest may only log in from localhost; pods reach the
	// management API from their own IPs, so the test makes a user, as a
	// platform team would.
	rabbitPass := "e2e-" + s.suffix
	if err := rabbitUser(ctx, "idc-e2e", rabbitPass); err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() { _ = rabbitAPI(context.Background(), http.MethodDelete, "/api/users/idc-e2e", nil) })
	s.secret(ctx, t, "e2e-rabbitmq", map[string]string{"uri": "amqp://idc-e2e:" + rabbitPass + "@" + localcluster.BridgeIP + ":5672/"})

	// RabbitMQ: a durable queue the test declares (the service owns it).
	queue := "idc-e2e-" + s.suffix
	amqpConn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() { _ = amqpConn.Close() })
	ch, err := amqpConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
	rabbit := s.apply(ctx, t, appendManifest("rabbitmq-ledger", "events_rabbitmq", fmt.Sprintf(
		"    rabbitmq: {uriSecretRef: {name: e2e-rabbitmq, key: uri}, queue: %s, managementURL: \"http://%s:15672\"}",
		queue, localcluster.BridgeIP), 1, ", deletionPolicy: Delete"))

	// Redis Streams.
	stream := "idc-e2e-" + s.suffix
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	s.parent.Cleanup(func() { _ = rdb.Del(context.Background(), stream).Err(); _ = rdb.Close() })
	redisIDC := s.apply(ctx, t, appendManifest("redis-ledger", "events_redis", fmt.Sprintf(
		"    redisStreams: {address: \"%s:6379\", stream: %s, group: redis-ledger}", localcluster.BridgeIP, stream), 1, ""))

	// Kafka: kfake, listening on the bridge IP so that pods reach it.
	topic := "idc-e2e-" + s.suffix
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic),
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(localcluster.BridgeIP, "0"))
		}))
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(kc.Close)
	kafkaIDC := s.apply(ctx, t, appendManifest("kafka-ledger", "events_kafka", fmt.Sprintf(
		"    kafka: {bootstrapServers: [%q], topics: [%s], consumerGroup: kafka-ledger}", kc.ListenAddrs()[0], topic), 1, ""))
	s.others = append(s.others, rabbit, redisIDC, kafkaIDC)

	for _, idc := range s.others {
		s.waitReady(ctx, t, idc, 1)
	}

	// Publish to each, with 20% re-sends.
	rmq, rds, kfk := newEvents("rmq", 600, 0.2, 1), newEvents("rds", 600, 0.2, 2), newEvents("kfk", 600, 0.2, 3)
	for _, b := range rmq.sends {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: b}); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range rds.sends {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"body": string(b)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	producer, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	for i, b := range kfk.sends {
		rec := &kgo.Record{Key: []byte(fmt.Sprint(i % 7)), Value: b}
		if err := producer.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		table, inbox string
		e            *events
	}{{"events_rabbitmq", "inbox_rabbitmq_ledger", rmq}, {"events_redis", "inbox_redis_ledger", rds}, {"events_kafka", "inbox_kafka_ledger", kfk}} {
		v := s.waitApplied(ctx, t, c.table, c.inbox, c.e, 3*time.Minute)
		t.Logf("%s: published %d (%d unique): %+v", c.table, len(c.e.sends), len(c.e.unique), v)
		if !v.ok() {
			t.Fatalf("%s: not exactly one effect per id: %+v", c.table, v)
		}
	}
}

// rabbitUser creates (or updates) a RabbitMQ user with the monitoring tag
// (the retention reader needs it) and full permissions on vhost "/".
func rabbitUser(ctx context.Context, user, pass string) error {
	if err := rabbitAPI(ctx, http.MethodPut, "/api/users/"+user, map[string]string{"password": pass, "tags": "monitoring"}); err != nil {
		return err
	}
	return rabbitAPI(ctx, http.MethodPut, "/api/permissions/%2F/"+user, map[string]string{"configure": ".*", "write": ".*", "read": ".*"})
}

// rabbitAPI calls the local management API as guest (from localhost).
func rabbitAPI(ctx context.Context, method, path string, body any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://127.0.0.1:15672"+path, r)
	if err != nil {
		return err
	}
	req.SetBasicAuth("guest", "guest")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("RabbitMQ management API: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("RabbitMQ management API %s %s: %s %s", method, path, resp.Status, b)
	}
	return nil
}

// podKilledUnderLoad: a JetStream -> append consumer with 2 replicas; one
// pod is deleted with --grace-period=0 while it consumes. Nothing is lost
// and nothing applied twice, proven from the database alone.
func (s *suite) podKilledUnderLoad(ctx context.Context, t *testing.T) {
	nc, js, err := localcluster.ConnectJetStream()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	stream, subject := "IDC_E2E_LEDGER_"+strings.ToUpper(s.suffix), "idc-e2e-"+s.suffix+".ledger"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}, MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	s.ledger = s.apply(ctx, t, appendManifest("jetstream-ledger", "events_ledger", fmt.Sprintf(
		"    natsJetStream: {url: %q, stream: %s, consumer: jetstream-ledger}", localcluster.PodNATSURL, stream), 2, ""))
	s.waitReady(ctx, t, s.ledger, 2)

	e := newEvents("led", 20000, 0.2, 4)
	for i, b := range e.sends {
		if _, err := js.PublishAsync(subject, b); err != nil {
			t.Fatal(err)
		}
		if i%2000 == 1999 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
	// Kill a replica once it is into the stream, and well before its end.
	var atKill tally
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		var err error
		atKill, err = s.tally(ctx, "events_ledger", "inbox_jetstream_ledger", e)
		if err == nil && atKill.distinct < 1000 {
			err = fmt.Errorf("%d applied", atKill.distinct)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	pods, err := s.c.ConsumerPods(ctx, s.ledger)
	if err != nil || len(pods) == 0 {
		t.Fatalf("pods: %v %v", pods, err)
	}
	victim := pods[0].Name
	if _, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "delete", "pod", victim, "--grace-period=0", "--force", "--wait=false"); err != nil {
		t.Fatal(err)
	}
	t.Logf("deleted pod %s with --grace-period=0 under load, %d of %d ids applied", victim, atKill.distinct, len(e.unique))
	if atKill.distinct > len(e.unique)*3/4 {
		t.Fatalf("the kill came too late to test anything: %d of %d ids were applied already", atKill.distinct, len(e.unique))
	}
	v := s.waitApplied(ctx, t, "events_ledger", "inbox_jetstream_ledger", e, 4*time.Minute)
	dctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := localcluster.WaitDrained(dctx, js, stream, "jetstream-ledger", nil); err != nil {
		t.Fatal(err)
	}
	if v, err = s.tally(ctx, "events_ledger", "inbox_jetstream_ledger", e); err != nil {
		t.Fatal(err)
	}
	t.Logf("KILL published=%d unique=%d applied=%d doubled=%d lost=%d phantom=%d", len(e.sends), v.unique, v.distinct, v.doubled, v.lost, v.phantom)
	if !v.ok() {
		t.Fatalf("after the kill: %+v", v)
	}
	s.waitReady(ctx, t, s.ledger, 2)
}

var _ = messagingv1alpha1.ConditionReady
