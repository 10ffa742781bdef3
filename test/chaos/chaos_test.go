package chaos

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// size is one form of the run.
type size struct {
	name       string
	messages   int           // published, duplicates included
	versions   int           // per entity key
	publishFor time.Duration // the whole workload is published over about this long,
	burstEvery time.Duration // in bursts this far apart
	minKills   int           // SIGKILLs, failpoint ones included
	// minFailpoint: kills that land exactly between COMMIT and ack.
	minFailpoint int
	minCuts      int // rounds of pg_terminate_backend that hit the runtime
	// A fault every gapMin..gapMax of time with a backlog; a cut with
	// probability cutShare, else a kill. A dead replica is restarted after 0..restartMax, armed with the
	// failpoint with probability armShare (always while failpoint kills are
	// owed).
	gapMin, gapMax, restartMax time.Duration
	cutShare, armShare         float64
	ackWait                    time.Duration // JetStream's redelivery lease
	deadline                   time.Duration // chaos and settling together
}

var (
	shortSize = size{name: "short", messages: 10_000, versions: 10, publishFor: 20 * time.Second, burstEvery: 2 * time.Second,
		minKills: 5, minFailpoint: 1, minCuts: 5,
		gapMin: 100 * time.Millisecond, gapMax: 400 * time.Millisecond, restartMax: 800 * time.Millisecond,
		cutShare: 0.35, armShare: 0.25, ackWait: 3 * time.Second, deadline: 6 * time.Minute}
	// The long form's bursts are 2,000 messages, and a fault is due 100 to
	// 400 ms into a backlog: the runtime drains a burst in about a second,
	// so longer gaps landed most kills after the drain (6 of 25 under
	// backlog with 1,000-message bursts and 300 to 1,200 ms gaps).
	longSize = size{name: "long", messages: 100_000, versions: 10, publishFor: 5 * time.Minute, burstEvery: 6 * time.Second,
		minKills: 30, minFailpoint: 5, minCuts: 5,
		gapMin: 100 * time.Millisecond, gapMax: 400 * time.Millisecond, restartMax: 1500 * time.Millisecond,
		cutShare: 0.3, armShare: 0.25, ackWait: 3 * time.Second, deadline: 35 * time.Minute}
)

const (
	dupShare = 0.2
	// dsnEnv names the variable holding the sink DSN (sink.dsnEnv); only
	// the runtime processes get it.
	dsnEnv = "IDC_CHAOS_DSN"
)

func chaosSize(t *testing.T) size {
	switch v := os.Getenv("IDC_CHAOS"); v {
	case "", "short":
		return shortSize
	case "long":
		return longSize
	default:
		t.Fatalf("IDC_CHAOS=%q: want long (or unset for the short form)", v)
		return size{}
	}
}

// TestChaos: see the package comment. It runs once per sink database
// (subtests postgres and mariadb), each printing its CHAOS line.
func TestChaos(t *testing.T) {
	sz := chaosSize(t)
	bin := buildBinary(t)
	for _, newDB := range sinkDBs {
		db := newDB(t)
		t.Run(db.dialect(), func(t *testing.T) { chaosRun(t, sz, bin, db) })
	}
}

func chaosRun(t *testing.T, sz size, bin string, db sinkDB) {
	began := time.Now()
	db.createTables(t)
	s := newStream(t)
	s.addConsumer(t, "append", sz.ackWait)
	s.addConsumer(t, "upsert", sz.ackWait)
	reps := replicas(s, db)
	f := newFleet(t, bin, dsnEnv+"="+db.runtimeDSN())
	t.Logf("set up in %s", time.Since(began).Round(100*time.Millisecond))
	seed := uint64(time.Now().UnixNano())
	t.Logf("%s form on %s, seed %d: %d messages, 3 replicas each of an append and an upsert consumer", sz.name, db.dialect(), seed, sz.messages)
	w := newWorkload(sz.messages, sz.versions, dupShare, newRand(seed))
	pub := newPublisher(s, w, sz.messages/10)
	d := newDriver(sz, f, reps, db.newCutter(t), s, pub, seed)

	ctx, cancel := context.WithTimeout(context.Background(), sz.deadline)
	defer cancel()
	if err := d.startAll(); err != nil {
		t.Fatal(err)
	}
	go pub.run(ctx, sz.publishFor, sz.burstEvery)
	t.Cleanup(func() { cancel(); <-pub.done }) // before the stream's connection closes
	runChaos(ctx, t, d, pub)
	chaosEnd := time.Now()
	watch := &settleWatch{s: s, reps: reps}
	if err := d.settle(ctx, watch.settled); err != nil {
		t.Fatalf("settling: %v; outstanding: %s", err, watch.describe(ctx))
	}
	settled := time.Now()
	for _, err := range f.stopAll(reps, time.Minute) {
		t.Error(err)
	}
	reportUnexpected(t, d.st)
	checkBroker(t, s, pub)
	v := checkDatabase(t, db, pub)
	line := v.line(d.st.kills(), int(pub.sent.Load()), db.dialect())
	fmt.Println(line)
	t.Log(line)
	t.Logf("%s; chaos %s, settling %s, total %s", d.st, chaosEnd.Sub(began).Round(time.Second),
		settled.Sub(chaosEnd).Round(time.Second), time.Since(began).Round(time.Second))
	logRuntimeEvidence(t, f)
	judge(t, sz, d.st, v)
}

func runChaos(ctx context.Context, t *testing.T, d *driver, pub *publisher) {
	t.Helper()
	if err := d.chaos(ctx); err != nil {
		t.Fatalf("chaos: %v (published %d of %d)", err, pub.sent.Load(), len(pub.w.order))
	}
	if pub.err != nil {
		t.Fatalf("publishing: %v", pub.err)
	}
}

// replicas are three of each consumer, as a Deployment with replicas: 3,
// on the run's sink database.
func replicas(s *stream, db sinkDB) []*replica {
	var out []*replica
	for _, cfg := range []*config.Config{appendConfig(s), upsertConfig(s)} {
		db.point(cfg)
		for i := range 3 {
			out = append(out, &replica{name: fmt.Sprintf("%s-%d", cfg.Source.NATSJetStream.Consumer, i), cfg: *cfg})
		}
	}
	return out
}

func baseConfig(s *stream, consumer, inboxTable string) *config.Config {
	return &config.Config{
		Name:    "chaos/" + consumer,
		Source:  config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: s.name, Consumer: consumer}},
		Message: config.Message{ID: config.Extractor{JSONPath: "$.eventId"}},
		Sink:    config.Sink{DSNEnv: dsnEnv, Schema: "chaos", InboxTable: inboxTable, Layout: config.LayoutTable},
		// Small batches: every message crosses more commit/ack boundaries and
		// replicas interleave more. Four transactions in flight per replica:
		// kills land between the commit and the ack of one lane while the
		// others are mid-transaction, and Fetch overlaps them.
		Delivery: config.Delivery{BatchSize: 20, InFlight: 4, Replicas: 3, MaxWait: config.Duration{Duration: 100 * time.Millisecond},
			BackoffInitial: config.Duration{Duration: 20 * time.Millisecond}, BackoffMax: config.Duration{Duration: 500 * time.Millisecond}},
		Retention: config.Retention{Mode: "Explicit", Window: config.Duration{Duration: time.Hour}},
	}
}

func appendConfig(s *stream) *config.Config {
	cfg := baseConfig(s, "append", appendInbox)
	cfg.Sink.Effect.Append = &config.Append{Table: "events", Columns: map[string]string{
		"event_id": "@messageId", "key": "$.key", "version": "$.version", "n": "$.n",
	}}
	cfg.Default()
	return cfg
}

func upsertConfig(s *stream) *config.Config {
	cfg := baseConfig(s, "upsert", upsertInbox)
	cfg.Message.Entity = &config.Entity{Key: config.Extractor{JSONPath: "$.key"}, Sequence: config.Extractor{JSONPath: "$.version"}}
	cfg.Sink.Effect.Upsert = &config.Upsert{Table: "orders", Key: []string{"key"}, SequenceColumn: "version",
		Columns: map[string]string{"key": "$.key", "version": "$.version", "status": "$.status", "event_id": "@messageId"}}
	cfg.Default()
	return cfg
}
