package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// notifyEndpoint is the test's http service on the bridge IP (pods reach
// it there): it dedupes on Idempotency-Key and records what it applied.
type notifyEndpoint struct {
	mu      sync.Mutex
	calls   int
	applied map[string]json.RawMessage // by Idempotency-Key
	url     string
}

func newNotifyEndpoint(t *testing.T) *notifyEndpoint {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(localcluster.BridgeIP, "0"))
	if err != nil {
		t.Fatalf("listening on the bridge IP: %v", err)
	}
	e := &notifyEndpoint{applied: map[string]json.RawMessage{}, url: "http://" + ln.Addr().String() + "/notify"}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond)
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		e.mu.Lock()
		defer e.mu.Unlock()
		e.calls++
		if key == "" || !json.Valid(body) {
			http.Error(w, "Idempotency-Key and a JSON body are required", http.StatusBadRequest)
			return
		}
		if _, seen := e.applied[key]; !seen {
			e.applied[key] = body
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return e
}

// pipelineAndHTTPOutbox: a two-stage pipeline applied as YAML on the node.
// Stage A (JetStream -> upsert) emits one event per new order through the
// outbox to a second stream; stage B consumes those events (id =
// Nats-Msg-Id) with the http effect and delivery: Outbox, against an
// endpoint the test serves on the bridge IP. Every original order reaches
// the endpoint exactly once (it dedupes on the key) and both resources
// report status.outbox.
func (s *suite) pipelineAndHTTPOutbox(ctx context.Context, t *testing.T) {
	nc, js, err := localcluster.ConnectJetStream()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	up := strings.ToUpper(s.suffix)
	inStream, inSubject := "IDC_E2E_PIPE_IN_"+up, "idc-e2e-"+s.suffix+".pipe.orders"
	midStream, midSubject := "IDC_E2E_PIPE_MID_"+up, "idc-e2e-"+s.suffix+".pipe.projected"
	for stream, subject := range map[string]string{inStream: inSubject, midStream: midSubject} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}, MaxAge: time.Hour}); err != nil {
			t.Fatal(err)
		}
		s.parent.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	}
	conn, err := pgx.Connect(ctx, s.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, "CREATE TABLE e2e.pipe_orders (order_id text PRIMARY KEY, status text NOT NULL, version int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	ep := newNotifyEndpoint(t)

	projector := s.apply(ctx, t, fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: pipe-projector}
spec:
  source:
    natsJetStream: {url: %[1]q, stream: %[2]s, consumer: pipe-projector}
  message:
    id: {jsonPath: $.eventId}
    entity: {key: {jsonPath: $.orderId}, sequence: {jsonPath: $.version}}
  sink:
    postgres: {connectionSecretRef: {name: e2e-db, key: dsn}, schema: e2e}
    inbox: {table: inbox_pipe_projector}
    effect:
      upsert: {table: pipe_orders, key: [order_id], columns: {order_id: $.orderId, status: $.status, version: $.version}}
  emit:
    natsJetStream: {url: %[1]q, subject: %[3]s}
    payload: {orderId: $.orderId, version: $.version, sourceId: "@messageId"}
    headers: {Order-Version: $.version}
  delivery: {batchSize: 100, maxWait: 100ms}
  retention: {maxReplayAge: 48h}
`, localcluster.PodNATSURL, inStream, midSubject))
	notifier := s.apply(ctx, t, fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: pipe-notifier}
spec:
  source:
    natsJetStream: {url: %q, stream: %s, consumer: pipe-notifier}
  message:
    id: {header: Nats-Msg-Id}
    entity: {key: {jsonPath: $.orderId}, sequence: {jsonPath: $.version}}
  sink:
    postgres: {connectionSecretRef: {name: e2e-db, key: dsn}, schema: e2e}
    inbox: {table: inbox_pipe_notifier}
    effect:
      http: {url: %q, timeout: 5s, delivery: Outbox}
  delivery: {batchSize: 100, maxWait: 100ms, maxAttempts: 5}
  retention: {maxReplayAge: 48h}
`, localcluster.PodNATSURL, midStream, ep.url))
	for _, idc := range []*messagingv1alpha1.IdempotentConsumer{projector, notifier} {
		s.waitReady(ctx, t, idc, 1)
	}
	if g := s.get(ctx, t, notifier).Status.Guarantee; g != messagingv1alpha1.GuaranteeAtLeastOnceWithIdempotencyKey {
		t.Errorf("pipe-notifier guarantee %q, want AtLeastOnceWithIdempotencyKey", g)
	}

	// 100 orders x 3 versions, each key's versions in order, plus 20% re-sends.
	rng := rand.New(rand.NewPCG(21, 22))
	var sends [][]byte
	unique := map[string]bool{}
	for v := 1; v <= 3; v++ {
		for k := range 100 {
			id := fmt.Sprintf("pipe-%03d-v%d", k, v)
			b, _ := json.Marshal(map[string]any{"eventId": id, "orderId": fmt.Sprintf("o-%03d", k), "version": v, "status": fmt.Sprintf("s%d", v)})
			unique[id] = true
			sends = append(sends, b)
			if rng.Float64() < 0.2 {
				sends = append(sends, b)
			}
		}
	}
	for _, b := range sends {
		if _, err := js.PublishAsync(inSubject, b); err != nil {
			t.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()

	var sources map[string]int
	if err := localcluster.Eventually(ctx, 3*time.Minute, func() error {
		ep.mu.Lock()
		defer ep.mu.Unlock()
		sources = map[string]int{}
		for _, body := range ep.applied {
			var ev struct {
				SourceID string `json:"sourceId"`
			}
			if err := json.Unmarshal(body, &ev); err != nil {
				return err
			}
			sources[ev.SourceID]++
		}
		if len(sources) < len(unique) {
			return fmt.Errorf("the endpoint applied %d of %d orders (%d calls)", len(sources), len(unique), ep.calls)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ep.mu.Lock()
	calls, keys := ep.calls, len(ep.applied)
	ep.mu.Unlock()
	for id, n := range sources {
		if !unique[id] || n != 1 {
			t.Errorf("order %s reached the endpoint under %d keys, want exactly one (an event id re-minted per publish?)", id, n)
		}
	}
	var stored, latest int
	if err := conn.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE version = 3) FROM e2e.pipe_orders").Scan(&stored, &latest); err != nil {
		t.Fatal(err)
	}
	if stored != 100 || latest != 100 {
		t.Errorf("stage A's projection: %d orders, %d at version 3; want 100 and 100", stored, latest)
	}
	t.Logf("PIPELINE on the node: published=%d unique=%d endpoint_keys=%d calls=%d orders_at_latest=%d", len(sends), len(unique), keys, calls, latest)
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		for _, idc := range []*messagingv1alpha1.IdempotentConsumer{projector, notifier} {
			o := s.get(ctx, t, idc).Status.Outbox
			if o == nil || o.Pending != 0 {
				return fmt.Errorf("%s: status.outbox %+v, want pending 0", idc.Name, o)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, idc := range []*messagingv1alpha1.IdempotentConsumer{projector, notifier} {
		if err := s.c.Client.Delete(ctx, idc); err != nil {
			t.Fatal(err)
		}
	}
}
