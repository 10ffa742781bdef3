package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// endpoint is a local http service that dedupes on Idempotency-Key, as the
// README asks of an http effect's endpoint: a key it has seen is answered
// 200 and applied no second time. Its faults are set per message id.
type endpoint struct {
	mu sync.Mutex
	// down answers every call 503 (an outage).
	down bool
	// refuse answers 422 (a permanent failure) for these ids.
	refuse map[string]bool
	// fail answers 500 (retryable, counted) for these ids, always.
	fail map[string]bool
	// flaky answers 500 to the first flaky[id] calls of these ids.
	flaky   map[string]int
	latency time.Duration

	calls     map[string]int // by key, every call that reached the handler
	downCalls map[string]int // by entity key, the calls answered 503 while down
	applied   map[string]int // by key: times the endpoint applied it (1, it dedupes)
	order     map[string][]int
	badKey    int // calls whose key is not the body's id
	srv       *httptest.Server
	totalHits int
}

func newEndpoint(t *testing.T, latency time.Duration) *endpoint {
	t.Helper()
	e := &endpoint{refuse: map[string]bool{}, fail: map[string]bool{}, flaky: map[string]int{}, latency: latency,
		calls: map[string]int{}, downCalls: map[string]int{}, applied: map[string]int{}, order: map[string][]int{}}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *endpoint) serve(w http.ResponseWriter, r *http.Request) {
	time.Sleep(e.latency)
	body, _ := io.ReadAll(r.Body)
	var ev event
	if err := json.Unmarshal(body, &ev); err != nil {
		http.Error(w, "not JSON", http.StatusBadRequest)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	e.mu.Lock()
	defer e.mu.Unlock()
	e.totalHits++
	if e.down {
		e.downCalls[ev.Key]++
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		return
	}
	e.calls[key]++
	if key != ev.ID {
		e.badKey++
	}
	switch {
	case e.refuse[key]:
		http.Error(w, "order cannot be projected", http.StatusUnprocessableEntity)
		return
	case e.fail[key], e.flaky[key] >= e.calls[key]:
		http.Error(w, "database hiccup", http.StatusInternalServerError)
		return
	}
	if e.applied[key] == 0 {
		e.order[ev.Key] = append(e.order[ev.Key], ev.Version)
	}
	e.applied[key]++
	if e.applied[key] > 1 {
		e.applied[key] = 1 // deduplicated: answered, not applied again
	}
	w.WriteHeader(http.StatusOK)
}

func (e *endpoint) set(fn func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fn()
}

func httpOutboxConfig(src config.Source, dsnEnv, url string) *config.Config {
	cfg := &config.Config{
		Name:   "integration/notifier",
		Source: src,
		Message: config.Message{ID: config.Extractor{JSONPath: "$.id"},
			Entity: &config.Entity{Key: config.Extractor{JSONPath: "$.key"}, Sequence: config.Extractor{JSONPath: "$.version"}}},
		Sink: config.Sink{DSNEnv: dsnEnv, Schema: "app", InboxTable: "inbox_notifier", Layout: config.LayoutTable,
			Effect: config.Effect{HTTP: &config.HTTP{URL: url, Delivery: config.HTTPOutbox, Timeout: config.Duration{Duration: 5 * time.Second}}}},
		Delivery: config.Delivery{BatchSize: 100, MaxWait: config.Duration{Duration: 100 * time.Millisecond}, MaxAttempts: 3,
			BackoffInitial: config.Duration{Duration: 20 * time.Millisecond}, BackoffMax: config.Duration{Duration: 200 * time.Millisecond}},
		Retention: config.Retention{Mode: "Explicit", Window: config.Duration{Duration: time.Hour}},
	}
	cfg.Default()
	return cfg
}

// httpOutbox runs the http effect with delivery: Outbox in the real binary
// against a local endpoint. While the endpoint is down the broker is still
// consumed and acked in full (the calls wait in the outbox, none is
// dead-lettered); once it is up every id is applied once, in version order
// per key. A 422 is dead-lettered at once, a call failing 500 after
// maxAttempts, a call failing 500 twice succeeds on its third; a redrive
// puts the dead-lettered calls back in the outbox and they are made.
func httpOutbox(t *testing.T, bin string) {
	const unique, keys = 600, 30
	ep := newEndpoint(t, 5*time.Millisecond)
	events := keyedEvents(unique, keys)
	refused, doomed, flaky := events[7].ID, events[100].ID, events[200].ID
	ep.set(func() {
		ep.down = true
		ep.refuse[refused], ep.fail[doomed], ep.flaky[flaky] = true, true, 2
	})
	in := newJetStream(t, 2*time.Second)
	db := newDatabase(t)
	db.exec(t, "CREATE SCHEMA app")
	cfg := httpOutboxConfig(in.sourceConfig(), dsnEnvFor(t, db), ep.srv.URL+"/notify")
	msgs := withDuplicates(events, dupShare, rand.New(rand.NewPCG(11, 12)))
	in.publish(t, msgs)

	p := startBinary(t, bin, cfg)
	// The endpoint is down, yet the stream is consumed and acked: the
	// calls wait in the outbox, and an outage counts no attempt.
	waitFor(t, 60*time.Second, "the stream to be consumed and acked while the endpoint is down", func() error {
		return in.drained(t.Context())
	})
	pending := db.queryInt(t, "SELECT count(*) FROM app.inbox_notifier_outbox WHERE sent_at IS NULL")
	if pending != unique {
		t.Fatalf("%d outbox rows unsent while the endpoint is down, want %d (one per unique id)", pending, unique)
	}
	// Several dispatcher passes against the outage: every entity key has
	// had its next call made more than maxAttempts times, so an outage
	// counted as attempts would have dead-lettered them all by now.
	waitFor(t, 60*time.Second, "every key to be called more than maxAttempts times against the outage", func() error {
		var err error
		ep.set(func() {
			for _, ev := range events {
				if n := ep.downCalls[ev.Key]; n <= cfg.Delivery.MaxAttempts {
					err = fmt.Errorf("key %s called %d times while down", ev.Key, n)
					return
				}
			}
		})
		return err
	})
	if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_notifier_dead_letters"); n != 0 {
		t.Fatalf("%d dead letters during an outage, want none (an endpoint that is down is not the message's fault)", n)
	}
	if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_notifier_outbox WHERE attempts > 0"); n != 0 {
		t.Errorf("%d outbox rows counted attempts during the outage, want 0", n)
	}
	if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_notifier_outbox WHERE last_error LIKE '%503%'"); n == 0 {
		t.Error("no outbox row records the 503 in last_error")
	}

	ep.set(func() { ep.down = false })
	waitFor(t, 60*time.Second, "the outbox to drain", func() error {
		if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_notifier_outbox WHERE sent_at IS NULL"); n != 0 {
			return fmt.Errorf("%d unsent", n)
		}
		return nil
	})
	type deadLetter struct {
		id, class string
		attempts  int
	}
	var dls []deadLetter
	rows, err := db.pool.Query(t.Context(), "SELECT message_id, reason_class, attempts FROM app.inbox_notifier_dead_letters ORDER BY message_id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var d deadLetter
		if err := rows.Scan(&d.id, &d.class, &d.attempts); err != nil {
			t.Fatal(err)
		}
		dls = append(dls, d)
	}
	want := []deadLetter{{refused, "http", 1}, {doomed, "http", 3}}
	if fmt.Sprint(dls) != fmt.Sprint(want) {
		t.Errorf("dead letters %v, want %v (the 422 at once, the always-500 after maxAttempts=3)", dls, want)
	}
	ep.set(func() {
		if ep.calls[flaky] != 3 || ep.applied[flaky] != 1 {
			t.Errorf("the flaky id was called %d times and applied %d, want 3 and 1", ep.calls[flaky], ep.applied[flaky])
		}
	})
	metrics := p.waitStatus(t, "/metrics", http.StatusOK, 5*time.Second)
	for _, m := range []string{"idc_outbox_published_total", `idc_outbox_rejected_total{sink_kind="postgres"} 2`, "idc_outbox_publish_failures_total",
		`idc_dead_letters_total{reason="http",sink_kind="postgres"} 2`} {
		if !strings.Contains(metrics, m) {
			t.Errorf("/metrics lacks %q", m)
		}
	}
	expectCleanExit(t, p, p.terminate(t))

	// The endpoint is fixed; a redrive puts both calls back in the outbox.
	ep.set(func() { ep.refuse, ep.fail = map[string]bool{}, map[string]bool{} })
	res, err := runRedrive(bin, writeConfig(t, cfg), "fix-endpoint", "--reason", "http")
	if err != nil {
		t.Fatalf("idc-runtime redrive: %v", err)
	}
	if res.Selected != 2 || res.Requeued != 2 || res.Applied != 0 || res.Duplicates != 0 {
		t.Errorf("redrive result %+v, want 2 selected and 2 requeued (not settled as duplicates of their claimed ids)", res)
	}
	p2 := startBinary(t, bin, cfg)
	waitFor(t, 60*time.Second, "the requeued calls to be made", func() error {
		if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_notifier_outbox WHERE sent_at IS NULL"); n != 0 {
			return fmt.Errorf("%d unsent", n)
		}
		return nil
	})
	expectCleanExit(t, p2, p2.terminate(t))

	ep.set(func() {
		applied, doubled := 0, 0
		for _, ev := range events {
			switch n := ep.applied[ev.ID]; {
			case n == 1:
				applied++
			case n > 1:
				doubled++
			}
		}
		calls := 0
		for _, n := range ep.calls {
			calls += n
		}
		t.Logf("HTTP_OUTBOX unique=%d applied=%d calls=%d outage_calls=%d dead_letters_redriven=%d", unique, applied, calls, ep.totalHits-calls, res.Requeued)
		if applied != unique || doubled != 0 || ep.badKey != 0 {
			t.Errorf("endpoint applied %d of %d ids (%d more than once, %d calls with a key other than the message id)", applied, unique, doubled, ep.badKey)
		}
		for key, versions := range ep.order {
			for i := 1; i < len(versions); i++ {
				// The two redriven ids come after their key's later
				// versions: a redrive is a repair, out of band.
				if versions[i] < versions[i-1] && !redrivenVersion(events, key, versions[i], refused, doomed) {
					t.Errorf("key %s applied out of order: %v", key, versions)
					break
				}
			}
		}
	})
	if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_notifier_dead_letters"); n != 0 {
		t.Errorf("%d dead letters left after the redrive", n)
	}
}

func redrivenVersion(events []event, key string, version int, ids ...string) bool {
	for _, ev := range events {
		if ev.Key == key && ev.Version == version {
			for _, id := range ids {
				if ev.ID == id {
					return true
				}
			}
		}
	}
	return false
}
