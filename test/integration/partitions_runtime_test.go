package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// startPartition runs `idc-runtime run --config FILE --partition=<i>` (i < 0:
// without the flag) as pod name, like startBinary.
func startPartition(t *testing.T, bin string, cfg *config.Config, i int, pod string) *process {
	t.Helper()
	var args []string
	if i >= 0 {
		args = append(args, fmt.Sprintf("--partition=%d", i))
	}
	return startRun(t, bin, cfg, pod, args)
}

// partitionedStream creates a stream on <subject>.* that the server
// partitions into n by key: <subject>.<key> is stored as
// <subject>.<partition>.<key> (nats-server 2.10+ subject transform).
func partitionedStream(t *testing.T, url string, n int) (jetstream.JetStream, string, string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2000))
	if err != nil {
		t.Fatal(err)
	}
	id := time.Now().UnixNano()
	stream, subject := fmt.Sprintf("IDC_PARTS_%d", id), fmt.Sprintf("idc.parts.%d", id)
	st := jetstream.StreamConfig{Name: stream, Subjects: []string{subject + ".*"}}
	if n > 0 {
		st.SubjectTransform = &jetstream.SubjectTransformConfig{Source: subject + ".*",
			Destination: fmt.Sprintf("%s.{{partition(%d,1)}}.{{wildcard(1)}}", subject, n)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, st); err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, stream)
	})
	return js, stream, subject
}

// TestPartitionsIntoOneInbox runs spec.source.natsJetStream.partitions: 4 as
// the controller renders it: four idc-runtime processes of one config, each
// started with --partition=<i>, each reading its own durable (created by the
// runtime, filtered to its partition's subjects), all claiming in one inbox
// and upserting one table through the sequence gate. The workload shares
// keys (many versions per key, 10% re-sent duplicates). Nothing is applied
// twice, every key ends at its highest version, and, since a key's messages
// all go to one partition, no transaction waited on another's row lock.
func TestPartitionsIntoOneInbox(t *testing.T) {
	const parts, keys, versions = 4, 120, 50
	bin := buildBinary(t)
	js, stream, subject := partitionedStream(t, natsURL, parts)
	db := newDatabase(t)
	createGatedOrders(t, db)
	cfg := appendConfig(config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: stream, Consumer: "orders", Partitions: parts}}, dsnEnvFor(t, db))
	gateOrders(cfg)
	cfg.Delivery.BatchSize = 40
	cfg.Delivery.Replicas = 1
	migrateInbox(t, db, cfg)

	rng := rand.New(rand.NewPCG(21, 22))
	var events []event
	for k := range keys {
		for v := 1; v <= versions; v++ {
			events = append(events, event{ID: fmt.Sprintf("k%03d-v%02d", k, v), Key: fmt.Sprintf("k%03d", k), Version: v, Status: fmt.Sprintf("s%02d", v)})
		}
	}
	rng.Shuffle(len(events), func(i, j int) { events[i], events[j] = events[j], events[i] })
	msgs := withDuplicates(events, 0.1, rng)

	procs := make([]*process, parts)
	for i := range parts {
		procs[i] = startPartition(t, bin, cfg, i, fmt.Sprintf("orders-p%d-0", i))
	}
	for _, p := range procs {
		p.waitStatus(t, "/readyz", 200, 60*time.Second)
	}
	stopSampling := sampleRowLockWaits(t, db)
	for _, m := range msgs {
		var e event
		if err := json.Unmarshal(m.body, &e); err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishAsync(subject+"."+e.Key, m.body); err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("publishing did not complete in 30s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	delivered := make([]uint64, parts)
	waitFor(t, 90*time.Second, "every partition's durable to have every message acknowledged", func() error {
		for i := range parts {
			c, err := js.Consumer(ctx, stream, config.PartitionConsumer("orders", i))
			if err != nil {
				return err
			}
			info := c.CachedInfo()
			if info.NumPending != 0 || info.NumAckPending != 0 {
				return fmt.Errorf("partition %d: %d undelivered, %d unacknowledged", i, info.NumPending, info.NumAckPending)
			}
			delivered[i] = info.Delivered.Consumer
		}
		var total uint64
		for _, d := range delivered {
			total += d
		}
		if total < uint64(len(msgs)) {
			return fmt.Errorf("%d of %d messages delivered", total, len(msgs))
		}
		return nil
	})
	waits := stopSampling()
	for _, p := range procs {
		expectCleanExit(t, p, p.terminate(t))
	}

	for i := range parts {
		c, err := js.Consumer(ctx, stream, config.PartitionConsumer("orders", i))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := c.CachedInfo().Config.FilterSubject, fmt.Sprintf("%s.%d.*", subject, i); got != want {
			t.Errorf("partition %d's durable is filtered to %q, want %q", i, got, want)
		}
		if delivered[i] == 0 {
			t.Errorf("partition %d's durable delivered nothing: the workload did not exercise it", i)
		}
	}
	if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_orders"); n != len(events) {
		t.Errorf("the inbox holds %d ids, want the %d unique ids", n, len(events))
	}
	wrong := db.queryInt(t, "SELECT count(*) FROM app.orders WHERE version <> $1 OR status <> $2", versions, fmt.Sprintf("s%02d", versions))
	if n := db.queryInt(t, "SELECT count(*) FROM app.orders"); n != keys || wrong != 0 {
		t.Errorf("%d rows, %d not at version %d: want every key at its highest version", n, wrong, versions)
	}
	doubled := db.queryInt(t, "SELECT count(*) FROM (SELECT key, new_version FROM app.changes GROUP BY 1, 2 HAVING count(*) > 1) d")
	back := db.queryInt(t, "SELECT count(*) FROM app.changes WHERE old_version >= new_version")
	if doubled != 0 || back != 0 {
		t.Errorf("%d versions applied twice, %d row changes backwards or sideways", doubled, back)
	}
	// Each process recorded its partition's durable as its consumer.
	rows, err := db.pool.Query(ctx, "SELECT replica, consumer->>'name' FROM app.inbox_orders_progress")
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string]bool{}
	for rows.Next() {
		var replica, name string
		if err := rows.Scan(&replica, &name); err != nil {
			t.Fatal(err)
		}
		i := strings.TrimPrefix(strings.SplitN(replica, "-", 3)[1], "p")
		if want := stream + "/orders-p" + i; name != want {
			t.Errorf("replica %s recorded consumer %s, want %s", replica, name, want)
		}
		recorded[name] = true
	}
	if rows.Err() != nil || len(recorded) != parts {
		t.Errorf("progress rows name %d consumers (%v), want %d", len(recorded), rows.Err(), parts)
	}
	if waits.waits != 0 {
		t.Errorf("%d backends sampled waiting on another transaction's row lock (%d in the inbox claim) over %d samples: partitions by key should leave none",
			waits.waits, waits.claim, waits.samples)
	}
	t.Logf("%d messages (%d duplicates) over %d partitions, delivered per partition %v; row-lock waits %d over %d samples",
		len(msgs), len(msgs)-len(events), parts, delivered, waits.waits, waits.samples)
}

// rowLockWaits is what sampleRowLockWaits saw.
type rowLockWaits struct{ waits, claim, samples int }

// sampleRowLockWaits samples pg_stat_activity every 10ms until the returned
// func is called: the backends waiting on another transaction's row lock
// (wait_event Lock:transactionid), of them in the inbox claim (as
// test/bench's sampleLockWaits).
func sampleRowLockWaits(t *testing.T, db *database) func() rowLockWaits {
	t.Helper()
	var (
		mu   sync.Mutex
		st   rowLockWaits
		stop = make(chan struct{})
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var w, c int
			err := db.pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE query LIKE 'INSERT INTO %inbox%')
				FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'transactionid'`).Scan(&w, &c)
			if err != nil {
				continue
			}
			mu.Lock()
			st.waits, st.claim, st.samples = st.waits+w, st.claim+c, st.samples+1
			mu.Unlock()
		}
	}()
	return func() rowLockWaits {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return st
	}
}

// TestPartitionsRefused: without --partition a partitioned config is a usage
// error naming the flag and its range; on the machine's nats-server 2.9.10,
// which has no subject transforms, a partition's process says which server
// it needs.
func TestPartitionsRefused(t *testing.T) {
	bin := buildBinary(t)
	db := newDatabase(t)
	_, stream, _ := partitionedStream(t, natsURL, 2)
	cfg := appendConfig(config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: stream, Consumer: "orders", Partitions: 2}}, dsnEnvFor(t, db))
	p := startPartition(t, bin, cfg, -1, "orders-0")
	if st := p.wait(t, 30*time.Second); st.ExitCode() == 0 || !strings.Contains(p.logs.String(), "--partition must be one of 0..1") {
		t.Errorf("without --partition: exit %d, logs %s", st.ExitCode(), p.logs.String())
	}
	plain := appendConfig(config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: stream, Consumer: "orders"}}, dsnEnvFor(t, db))
	p = startPartition(t, bin, plain, 0, "orders-0")
	if st := p.wait(t, 30*time.Second); st.ExitCode() == 0 || !strings.Contains(p.logs.String(), "--partition is set, but the source is not partitioned") {
		t.Errorf("--partition without partitions: exit %d, logs %s", st.ExitCode(), p.logs.String())
	}

	sys, err := natstest.OpenSystem()
	if err != nil {
		t.Fatal(err)
	}
	_, oldStream, _ := partitionedStream(t, sys.URL, 0)
	old := appendConfig(config.Source{NATSJetStream: &config.JetStream{URL: sys.URL, Stream: oldStream, Consumer: "orders", Partitions: 2}}, dsnEnvFor(t, db))
	migrateInbox(t, db, old)
	p = startPartition(t, bin, old, 1, "orders-p1-0")
	want := "partitions needs nats-server 2.10 or later (this server is " + sys.Version + ")"
	waitFor(t, 60*time.Second, "the runtime on nats-server "+sys.Version+" to say "+want, func() error {
		if !strings.Contains(p.logs.String(), want) {
			return fmt.Errorf("not logged yet")
		}
		return nil
	})
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t, 30*time.Second)
}
