package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const (
	// endpointLatency is the http endpoint's service time per call.
	endpointLatency = 50 * time.Millisecond
	// httpKeys x httpVersions unique events plus 20% duplicates.
	httpKeys     = 3000
	httpVersions = 3
	httpReplicas = 2
)

// dedupEndpoint is the remote side of an http effect as the README asks for
// it: every call takes endpointLatency, and a key seen before is answered
// 200 without being applied again.
type dedupEndpoint struct {
	mu      sync.Mutex
	calls   int
	applied map[string]bool
	srv     *httptest.Server
}

func newDedupEndpoint(b *testing.B) *dedupEndpoint {
	e := &dedupEndpoint{applied: map[string]bool{}}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(endpointLatency)
		key := r.Header.Get("Idempotency-Key")
		e.mu.Lock()
		e.calls++
		e.applied[key] = true
		e.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	b.Cleanup(e.srv.Close)
	return e
}

func (e *dedupEndpoint) counts() (calls, applied int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls, len(e.applied)
}

// BenchmarkHTTPDelivery prints the http effect's consumer rate inline
// versus through the outbox, in one run, against a local endpoint with 50 ms
// latency that dedupes on Idempotency-Key: 2 replicas of the binary, batch
// 500, on a JetStream stream of 9,000 unique events plus 20% duplicates.
// Inline, the loop waits for the calls before it acks; with delivery:
// Outbox it acks once the claim and the outbox row commit, and the
// dispatcher makes the calls after. Rates leave out the first settled batch
// (its time is the start-up's). The row fails unless the endpoint saw every
// id at least once.
func BenchmarkHTTPDelivery(b *testing.B) {
	t := newThroughputEnv(b, newWorkload())
	bodies := httpBodies()
	stream := t.publishStream(b, "IDC_HTTP", bodies)
	for range b.N {
		inline := t.runHTTP(b, stream, len(bodies), config.HTTPInline)
		outbox := t.runHTTP(b, stream, len(bodies), config.HTTPOutbox)
		printRow(inline.consumer)
		printRow(outbox.consumer)
		printRow(outbox.dispatch)
		fmt.Printf("RATIO http_outbox_vs_inline_consumer=%.2f\n", outbox.consumer.rate()/inline.consumer.rate())
		b.ReportMetric(outbox.consumer.rate()/inline.consumer.rate(), "outbox_vs_inline")
	}
}

func httpBodies() [][]byte {
	rng := rand.New(rand.NewPCG(9, 10))
	var bodies [][]byte
	for k := range httpKeys {
		for v := 1; v <= httpVersions; v++ {
			body, _ := json.Marshal(order{ID: fmt.Sprintf("h%05d-v%d", k, v), Key: fmt.Sprintf("h%05d", k), Version: v, Status: "s", Amount: v})
			bodies = append(bodies, body)
		}
	}
	unique := len(bodies)
	for range int(float64(unique) * dupShare / (1 - dupShare)) {
		bodies = append(bodies, bodies[rng.IntN(unique)])
	}
	return bodies
}

// publishStream creates a stream named prefix_<time> holding bodies.
func (t *throughputEnv) publishStream(b *testing.B, prefix string, bodies [][]byte) string {
	b.Helper()
	return t.publishStreamTo(b, prefix, bodies, func(stream string, _ []byte) string { return stream + ".orders" })
}

// publishStreamTo is publishStream with each body's subject chosen by
// subject(stream name, body).
func (t *throughputEnv) publishStreamTo(b *testing.B, prefix string, bodies [][]byte, subject func(stream string, body []byte) string) string {
	b.Helper()
	name := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := t.nats.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
		b.Fatalf("creating stream: %v", err)
	}
	deleteStreamLater(b, t.nats.js, name)
	for _, body := range bodies {
		if _, err := t.nats.js.PublishAsync(subject(name, body), body); err != nil {
			b.Fatalf("publishing: %v", err)
		}
	}
	select {
	case <-t.nats.js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal("publishing did not complete")
	}
	return name
}

// deleteStreamLater deletes stream from js at the benchmark's end (js
// captured: the environment's server may be another by then).
func deleteStreamLater(b *testing.B, js jetstream.JetStream, stream string) {
	b.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
}

type httpRun struct{ consumer, dispatch row }

// runHTTP runs httpReplicas replicas with the http effect and delivery
// until the endpoint applied every unique id: consumer is the time until
// every message was settled (claimed and acked), dispatch until the last
// call was made.
func (t *throughputEnv) runHTTP(b *testing.B, stream string, total int, delivery string) httpRun {
	b.Helper()
	ep := newDedupEndpoint(b)
	schema := t.schema(b)
	cfg := runtimeConfig(schema, config.Source{NATSJetStream: &config.JetStream{URL: t.nats.url(), Stream: stream, Consumer: "c_" + schema}}, batchSize)
	cfg.Sink.Effect = config.Effect{HTTP: &config.HTTP{URL: ep.srv.URL + "/orders", Method: http.MethodPost,
		Timeout: config.Duration{Duration: 10 * time.Second}, Delivery: delivery}}
	rs := t.startReplicas(b, cfg, httpReplicas)
	unique := httpKeys * httpVersions
	deadline := time.Now().Add(rowTimeout)
	var first, settled time.Time
	var firstN int
	for {
		n := rs.settled()
		now := time.Now()
		if n > 0 && first.IsZero() {
			first, firstN = now, n
		}
		if n >= total && settled.IsZero() {
			settled = now
		}
		_, applied := ep.counts()
		if !settled.IsZero() && applied >= unique {
			break
		}
		if now.After(deadline) {
			b.Fatalf("http %s: settled %d of %d messages, endpoint applied %d of %d ids in %s; logs: %v", delivery, n, total, applied, unique, rowTimeout, rs.logs)
		}
		for _, c := range rs.cmds {
			if c.ProcessState != nil {
				b.Fatalf("http %s: a replica exited: %v; logs: %v", delivery, c.ProcessState, rs.logs)
			}
		}
		time.Sleep(pollEvery)
	}
	done := time.Now()
	rss := rs.peakRSSMiB()
	rs.stop()
	calls, applied := ep.counts()
	if applied != unique || calls < unique {
		b.Fatalf("http %s: the endpoint applied %d ids in %d calls, want %d ids, each called at least once", delivery, applied, calls, unique)
	}
	note := fmt.Sprintf("endpoint 50 ms per call, dedupes on Idempotency-Key: %d calls for %d ids", calls, unique)
	name := map[string]string{config.HTTPInline: "http_inline", config.HTTPOutbox: "http_outbox"}[delivery]
	out := httpRun{consumer: row{name: name + "_consumer", replicas: httpReplicas, batch: batchSize, msgs: total - firstN,
		elapsed: settled.Sub(first), rssMiB: rss, note: note, nats: t.nats.version()}}
	if out.consumer.msgs == 0 {
		b.Fatalf("http %s: the whole stream settled in the first poll; make the workload larger", delivery)
	}
	if delivery == config.HTTPOutbox {
		out.dispatch = row{name: "http_outbox_dispatch", replicas: httpReplicas, batch: batchSize, msgs: unique,
			elapsed: done.Sub(first), nats: t.nats.version(), note: "until the endpoint applied the last id (from the first settled batch)"}
	}
	return out
}
