package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// upgradeResource is one consumer of the step, fed from input.
type upgradeResource struct {
	idc   *messagingv1alpha1.IdempotentConsumer
	input string // the load stream it (or its pipeline's first stage) reads
	// effects is the query of (id, count) pairs of its effects; stream and
	// consumer are its own broker position.
	effects          string
	js               jetstream.JetStream
	stream, consumer string
	// upstreamOutbox is the outbox that feeds its stream (a pipeline's
	// second stage): its stream is complete only once that is empty.
	upstreamOutbox string
}

type upgradeWorkload struct {
	dsn       string
	resources []*upgradeResource
	inputs    map[string]*loadInput
	stopCh    chan struct{}
	wg        sync.WaitGroup
}

// loadInput is one published stream: what the load sent there.
type loadInput struct {
	js      jetstream.JetStream
	subject string
	mu      sync.Mutex
	sent    map[string]int // id -> times published
	err     error
}

func (s *suite) upgradeWorkload(ctx context.Context, t *testing.T, via string) *upgradeWorkload {
	t.Helper()
	db := s.dbName() + "_upgrade_" + via
	dsn, err := localcluster.RecreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() {
		if !s.parent.Failed() {
			_ = localcluster.DropDatabase(context.Background(), db)
		}
	})
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	// Upsert targets log every row they really write (a trigger): an
	// effect applied twice is a second log row even where the upsert
	// itself would hide it.
	for _, q := range []string{
		"CREATE SCHEMA e2e",
		"CREATE TABLE e2e.effect_log (target text NOT NULL, id text NOT NULL)",
		`CREATE FUNCTION e2e.log_effect() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN INSERT INTO e2e.effect_log VALUES (TG_TABLE_NAME, NEW.order_id); RETURN NEW; END $$`,
		"CREATE TABLE e2e.up_orders (order_id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)",
		"CREATE TRIGGER log AFTER INSERT OR UPDATE ON e2e.up_orders FOR EACH ROW EXECUTE FUNCTION e2e.log_effect()",
		"CREATE TABLE e2e.up_pipe_orders (order_id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)",
		"CREATE TRIGGER log AFTER INSERT OR UPDATE ON e2e.up_pipe_orders FOR EACH ROW EXECUTE FUNCTION e2e.log_effect()",
		"CREATE TABLE e2e.up_pipe_events (event_id text NOT NULL, num int NOT NULL)",
		"CREATE TABLE e2e.up_scaled (event_id text NOT NULL, num int NOT NULL)",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s.secret(ctx, t, "upgrade-db", map[string]string{"dsn": localcluster.PodDSN(dsn)})

	nc, js, err := localcluster.ConnectJetStream()
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(nc.Close)
	scaleJS := s.scaleNATS(ctx, t)
	up := strings.ToUpper(via + "_" + s.suffix)
	streams := []struct {
		js              jetstream.JetStream
		stream, subject string
	}{
		{js, "IDC_UP_ORDERS_" + up, "idc-up-" + via + "-" + s.suffix + ".orders"},
		{js, "IDC_UP_PIPE_IN_" + up, "idc-up-" + via + "-" + s.suffix + ".pipe-in"},
		{js, "IDC_UP_PIPE_MID_" + up, "idc-up-" + via + "-" + s.suffix + ".pipe-mid"},
		{scaleJS, "IDC_UP_SCALED_" + up, "idc-up-" + via + "-" + s.suffix + ".scaled"},
	}
	for _, st := range streams {
		if _, err := st.js.CreateStream(ctx, jetstream.StreamConfig{Name: st.stream, Subjects: []string{st.subject}, MaxAge: time.Hour,
			Duplicates: localcluster.StreamDuplicateWindow}); err != nil {
			t.Fatal(err)
		}
		s.parent.Cleanup(func() { _ = st.js.DeleteStream(context.Background(), st.stream) })
	}
	w := &upgradeWorkload{dsn: dsn, inputs: map[string]*loadInput{}, stopCh: make(chan struct{})}
	for _, i := range []int{0, 1, 3} {
		w.inputs[streams[i].stream] = &loadInput{js: streams[i].js, subject: streams[i].subject, sent: map[string]int{}}
	}
	upsert := func(name, table, stream, extra string, replicas int) string {
		return fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: %[1]s}
spec:
  source:
    natsJetStream: {url: %[2]q, stream: %[3]s, consumer: %[1]s}
  message:
    id: {header: Nats-Msg-Id}
    entity: {key: {jsonPath: $.orderId}, sequence: {jsonPath: $.version}}
  sink:
    postgres: {connectionSecretRef: {name: upgrade-db, key: dsn}, schema: e2e}
    inbox: {table: inbox_%[4]s}
    effect:
      upsert: {table: %[4]s, key: [order_id], columns: {order_id: $.orderId, status: $.status, version: $.version}}
%[5]s  delivery: {batchSize: 50, maxWait: 100ms}
  retention: {maxReplayAge: 48h}
  runtime: {replicas: %[6]d}
`, name, localcluster.PodNATSURL, stream, table, extra, replicas)
	}
	orders := s.apply(ctx, t, upsert("up-orders", "up_orders", streams[0].stream, "", 2))
	pipeA := s.apply(ctx, t, upsert("up-pipe-a", "up_pipe_orders", streams[1].stream, fmt.Sprintf(`  emit:
    natsJetStream: {url: %q, subject: %s}
    payload: {orderId: $.orderId, version: $.version, sourceId: "@messageId"}
`, localcluster.PodNATSURL, streams[2].subject), 1))
	pipeB := s.apply(ctx, t, fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: up-pipe-b}
spec:
  source:
    natsJetStream: {url: %q, stream: %s, consumer: up-pipe-b}
  message:
    id: {header: Nats-Msg-Id}
  sink:
    postgres: {connectionSecretRef: {name: upgrade-db, key: dsn}, schema: e2e}
    inbox: {table: inbox_up_pipe_events}
    effect:
      append: {table: up_pipe_events, columns: {event_id: $.sourceId, num: $.version}}
  delivery: {batchSize: 50, maxWait: 100ms}
  retention: {maxReplayAge: 48h}
`, localcluster.PodNATSURL, streams[2].stream))
	scaled := s.apply(ctx, t, fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: up-scaled}
spec:
  source:
    natsJetStream: {url: "nats://%[1]s:%[2]d", stream: %[3]s, consumer: up-scaled}
  message:
    id: {header: Nats-Msg-Id}
  sink:
    postgres: {connectionSecretRef: {name: upgrade-db, key: dsn}, schema: e2e}
    inbox: {table: inbox_up_scaled}
    effect:
      append: {table: up_scaled, columns: {event_id: "@messageId", num: $.version}}
  delivery: {batchSize: 50, maxWait: 100ms}
  retention: {maxReplayAge: 48h}
  runtime:
    autoscaling: {minReplicas: 1, maxReplicas: 2, lagPerReplica: 500, pollingInterval: 2s, cooldownPeriod: 10s,
      natsMonitoringURL: "http://%[1]s:%[4]d", natsAccount: $G}
`, localcluster.BridgeIP, scaleNATSPort, streams[3].stream, scaleMonitorPort))
	logged := func(table string) string {
		return fmt.Sprintf("SELECT id, count(*) FROM e2e.effect_log WHERE target = '%s' GROUP BY id", table)
	}
	appended := func(table string) string {
		return fmt.Sprintf("SELECT event_id, count(*) FROM e2e.%s GROUP BY event_id", table)
	}
	w.resources = []*upgradeResource{
		{idc: orders, input: streams[0].stream, effects: logged("up_orders"), js: js, stream: streams[0].stream, consumer: "up-orders"},
		{idc: pipeA, input: streams[1].stream, effects: logged("up_pipe_orders"), js: js, stream: streams[1].stream, consumer: "up-pipe-a"},
		{idc: pipeB, input: streams[1].stream, effects: appended("up_pipe_events"), js: js, stream: streams[2].stream, consumer: "up-pipe-b",
			upstreamOutbox: "e2e.inbox_up_pipe_orders_outbox"},
		{idc: scaled, input: streams[3].stream, effects: appended("up_scaled"), js: scaleJS, stream: streams[3].stream, consumer: "up-scaled"},
	}
	return w
}

// startLoad publishes to every input at a steady 100 messages a second
// each (one in ten re-sent once, 300 ms later) until stopLoad.
func (w *upgradeWorkload) startLoad(ctx context.Context, t *testing.T) {
	t.Helper()
	for stream, in := range w.inputs {
		w.wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-w.stopCh:
					return
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				name := func(i int) string { return fmt.Sprintf("%s-%06d", strings.ToLower(stream), i) }
				ids := []string{name(i)}
				if i%10 == 0 && i >= 30 {
					// Past the stream's duplicate window: the consumer
					// gets it again and the inbox must catch it.
					ids = append(ids, name(i-30))
				}
				for _, id := range ids {
					msg := nats.NewMsg(in.subject)
					msg.Header.Set("Nats-Msg-Id", id)
					msg.Data = fmt.Appendf(nil, `{"orderId":%q,"status":"placed","version":1}`, id)
					pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					_, err := in.js.PublishMsg(pctx, msg)
					cancel()
					in.mu.Lock()
					if err != nil && in.err == nil {
						in.err = fmt.Errorf("publishing %s to %s: %w", id, stream, err)
					}
					if err == nil {
						in.sent[id]++
					}
					in.mu.Unlock()
				}
			}
		})
	}
}

// stopLoad ends the load and returns, per input stream, how often each id
// was published.
func (w *upgradeWorkload) stopLoad(t *testing.T) map[string]map[string]int {
	t.Helper()
	close(w.stopCh)
	w.wg.Wait()
	out := map[string]map[string]int{}
	for stream, in := range w.inputs {
		if in.err != nil {
			t.Fatal(in.err)
		}
		out[stream] = in.sent
	}
	return out
}

type upgradeTally struct{ sends, unique, rows, distinct, doubled, lost int }

func (w *upgradeWorkload) effects(ctx context.Context, t *testing.T, r *upgradeResource, sent map[string]int) upgradeTally {
	t.Helper()
	conn, err := pgx.Connect(ctx, w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(ctx, r.effects)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		seen[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	v := upgradeTally{unique: len(sent), distinct: len(seen)}
	for id, n := range sent {
		v.sends += n
		switch m := seen[id]; {
		case m == 0:
			v.lost++
		case m > 1:
			v.doubled++
		}
	}
	for _, n := range seen {
		v.rows += n
	}
	return v
}

// waitDrainedIn waits until the resource's own broker consumer has nothing
// pending or unacknowledged.
func (s *suite) waitDrainedIn(ctx context.Context, t *testing.T, w *upgradeWorkload, r *upgradeResource) {
	t.Helper()
	dctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if r.upstreamOutbox != "" {
		// The stream is drained before its last events are: the upstream
		// stage's relay may still hold some in its outbox.
		conn, err := pgx.Connect(dctx, w.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close(ctx) }()
		for {
			var unsent int
			if err := conn.QueryRow(dctx, `SELECT count(*) FROM `+r.upstreamOutbox+` WHERE sent_at IS NULL`).Scan(&unsent); err != nil {
				t.Fatalf("%s: reading the upstream outbox: %v", r.idc.Name, err)
			}
			if unsent == 0 {
				break
			}
			select {
			case <-dctx.Done():
				t.Fatalf("%s: %d events still unsent in %s after 3 minutes", r.idc.Name, unsent, r.upstreamOutbox)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	if _, err := localcluster.WaitDrained(dctx, r.js, r.stream, r.consumer, nil); err != nil {
		t.Fatalf("%s: %v", r.idc.Name, err)
	}
}
