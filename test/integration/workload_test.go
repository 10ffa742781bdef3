package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/consumer"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
	"github.com/idempotency-dev/idc-operator/runtime/source"
	"github.com/idempotency-dev/idc-operator/runtime/source/open"
)

// event is the payload of every test message.
type event struct {
	ID      string `json:"id"`
	Key     string `json:"key,omitempty"`
	Version int    `json:"version,omitempty"`
	Status  string `json:"status,omitempty"`
	N       int    `json:"n"`
}

func (e event) outgoing() outgoing {
	b, _ := json.Marshal(e) // a flat struct always marshals
	return outgoing{id: e.ID, body: b}
}

// withDuplicates returns the events in order plus re-sent copies making up
// dupShare of the result: half right after their original (so concurrent
// consumers race on them), half at a random later position.
func withDuplicates(events []event, dupShare float64, rng *rand.Rand) []outgoing {
	dups := int(float64(len(events)) * dupShare / (1 - dupShare))
	copies := make(map[int]int, dups) // index of an original → copies after it
	adjacent := make(map[int]bool, dups/2)
	for i := 0; i < dups; i++ {
		j := rng.IntN(len(events))
		copies[j]++
		if i%2 == 0 {
			adjacent[j] = true
		}
	}
	out := make([]outgoing, 0, len(events)+dups)
	var later []outgoing
	for i, e := range events {
		out = append(out, e.outgoing())
		for range copies[i] {
			if adjacent[i] {
				out = append(out, e.outgoing())
				adjacent[i] = false
				continue
			}
			later = append(later, e.outgoing())
		}
		// Flush some postponed copies at random points after their original.
		for len(later) > 0 && rng.IntN(4) == 0 {
			out = append(out, later[0])
			later = later[1:]
		}
	}
	return append(out, later...)
}

func plainEvents(n int) []event {
	out := make([]event, n)
	for i := range out {
		out[i] = event{ID: fmt.Sprintf("evt-%06d", i), N: i}
	}
	return out
}

// appendConfig is a config whose effect appends one row per new message to
// app.effects, which has no unique constraint: a double effect shows up as
// a second row with the same message_id.
func appendConfig(src config.Source, dsnEnv string) *config.Config {
	cfg := &config.Config{
		Name:    "integration/orders",
		Source:  src,
		Message: config.Message{ID: config.Extractor{JSONPath: "$.id"}},
		Sink: config.Sink{DSNEnv: dsnEnv, Schema: "app", InboxTable: "inbox_orders", Layout: config.LayoutTable,
			Effect: config.Effect{Append: &config.Append{Table: "effects", Columns: map[string]string{
				"message_id": "@messageId", "n": "$.n",
			}}}},
		Delivery: config.Delivery{BatchSize: 100, MaxWait: config.Duration{Duration: 100 * time.Millisecond},
			BackoffInitial: config.Duration{Duration: 20 * time.Millisecond}, BackoffMax: config.Duration{Duration: 500 * time.Millisecond}},
		Retention: config.Retention{Mode: "Explicit", Window: config.Duration{Duration: time.Hour}},
	}
	cfg.Default()
	return cfg
}

const effectsTable = "CREATE TABLE app.effects (seq bigserial PRIMARY KEY, message_id text NOT NULL, n int NOT NULL)"

// testLogger logs through t until the test ends; adapters' background
// goroutines may still log while they close, which t.Log forbids.
func testLogger(t *testing.T) logr.Logger {
	var done atomic.Bool
	t.Cleanup(func() { done.Store(true) }) // registered first, so it runs last
	return funcr.New(func(prefix, args string) {
		if !done.Load() {
			t.Log(prefix, args)
		}
	}, funcr.Options{Verbosity: 0})
}

// recordingSource remembers what the loop fetched and acknowledged: how
// often each id was delivered, and which deliveries (by native id) were
// acknowledged. Fetch and Ack run concurrently (in-flight lanes).
type recordingSource struct {
	source.Source
	mu        sync.Mutex
	delivered map[string]int
	// unacked maps every delivery not acknowledged yet (by its Ref: native
	// ids may be empty, as for RabbitMQ messages without message_id) to its
	// event id.
	unacked map[any]string
}

func (r *recordingSource) Fetch(ctx context.Context, maxN int, maxWait time.Duration) ([]source.Message, error) {
	msgs, err := r.Source.Fetch(ctx, maxN, maxWait)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unacked == nil {
		r.unacked = map[any]string{}
	}
	for _, m := range msgs {
		var e event
		_ = json.Unmarshal(m.Body, &e)
		r.delivered[e.ID]++
		r.unacked[m.Ref] = e.ID
	}
	return msgs, err
}

func (r *recordingSource) Ack(ctx context.Context, msgs []source.Message) error {
	err := r.Source.Ack(ctx, msgs)
	if err == nil {
		r.mu.Lock()
		for _, m := range msgs {
			delete(r.unacked, m.Ref)
		}
		r.mu.Unlock()
	}
	return err
}

// snapshot returns the event ids fetched and never acknowledged (the ones
// in doubt after a crash), and the delivery count per event id.
func (r *recordingSource) snapshot() (inDoubt []string, delivered map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delivered = make(map[string]int, len(r.delivered))
	for k, v := range r.delivered {
		delivered[k] = v
	}
	for _, id := range r.unacked {
		inDoubt = append(inDoubt, id)
	}
	return inDoubt, delivered
}

// crashed is the panic value a crash hook throws to abandon a batch between
// commit and ack, as a killed process would.
type crashed struct{}

// runner is one consumer replica driven in-process.
type runner struct {
	name    string
	src     *recordingSource
	metrics *consumer.Metrics
	cancel  context.CancelFunc
	done    chan any // receives the recovered panic value (nil on a normal return)
	runErr  error
}

// startRunner opens the source (like the binary does) and runs a consumer
// on its own pool, as a separate pod would.
func startRunner(t *testing.T, cfg *config.Config, db *database, name string) *runner {
	t.Helper()
	log := testLogger(t).WithValues("replica", name)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src, err := open.Open(ctx, cfg, log, name)
	if err != nil {
		t.Fatalf("opening the %s source: %v", cfg.Source.Kind(), err)
	}
	pool := db.newPool(t)
	metrics, err := consumer.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{name: name, src: &recordingSource{Source: src, delivered: map[string]int{}}, metrics: metrics, done: make(chan any, 1)}
	c, err := consumer.New(r.src, postgres.New(pool), cfg, metrics, log)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, runCancel := context.WithCancel(context.Background())
	r.cancel = runCancel
	go func() {
		defer func() { r.done <- recover() }()
		r.runErr = c.Run(runCtx)
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop asks for a graceful stop, waits for the loop and closes the source.
// It returns the panic value if the loop crashed.
func (r *runner) stop(t *testing.T) any {
	t.Helper()
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	var p any
	select {
	case p = <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("replica %s did not stop within 30s", r.name)
	}
	if r.runErr != nil {
		t.Errorf("replica %s: Run returned %v", r.name, r.runErr)
	}
	if err := r.src.Close(); err != nil {
		t.Errorf("replica %s: closing the source: %v", r.name, err)
	}
	return p
}

// waitCrash waits for the loop to die from a crash hook and closes its
// source without acknowledging anything more.
func (r *runner) waitCrash(t *testing.T) {
	t.Helper()
	select {
	case p := <-r.done:
		if _, ok := p.(crashed); !ok {
			t.Fatalf("replica %s ended with %v, want the injected crash", r.name, p)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("replica %s did not crash within 60s", r.name)
	}
	r.cancel()
	r.cancel = nil
	_ = r.src.Close()
}

func (r *runner) settled() int { return int(testutil.ToFloat64(r.metrics.Messages)) }

func (r *runner) duplicates() int { return int(testutil.ToFloat64(r.metrics.DuplicatesSkipped)) }

func (r *runner) stale() int { return int(testutil.ToFloat64(r.metrics.StaleRefused)) }

// waitSettled waits until the replicas together settled (processed and
// acknowledged) at least total messages.
func waitSettled(t *testing.T, total int, timeout time.Duration, runners ...*runner) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("%d messages settled", total), func() error {
		sum := 0
		for _, r := range runners {
			sum += r.settled()
		}
		if sum < total {
			return fmt.Errorf("%d of %d settled", sum, total)
		}
		return nil
	})
}

// checkExactlyOnce asserts one effect row per unique id, none doubled, no
// dead letters, and that the broker holds nothing unacknowledged.
func checkExactlyOnce(t *testing.T, db sinkDB, b broker, unique int) {
	t.Helper()
	rows, ids, doubled := db.effects(t, "effects", "message_id")
	if rows != unique || ids != unique || doubled != 0 {
		t.Errorf("%s: %d effect rows over %d ids (%d ids doubled), want exactly %d, one each", b.name(), rows, ids, doubled, unique)
	}
	if dl := db.queryInt(t, "SELECT count(*) FROM "+db.table("inbox_orders_dead_letters")); dl != 0 {
		t.Errorf("%s: %d dead letters, want none", b.name(), dl)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Acknowledgements and consumer-group state settle asynchronously on
	// some brokers; give them a moment.
	waitFor(t, 15*time.Second, b.name()+" to report every message acknowledged", func() error { return b.drained(ctx) })
}

// migrateInbox provisions the inbox as the controller (or the runtime at
// startup) would, through the seam.
func migrateInbox(t *testing.T, db sinkDB, cfg *config.Config) {
	t.Helper()
	store, err := sink.InboxFor(db.seam(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
}
