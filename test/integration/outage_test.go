package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// outageMessages is how many messages each broker's run publishes.
const outageMessages = 300

// outageLongerThanTheWindow is issue 19's first proof, once per broker and
// sink database (PostgreSQL, MariaDB), each run with its own broker and
// database: the real binary commits a batch and dies before acknowledging
// it (the failpoint), stays down for at least 4× its derived window and
// longer than retention.StaleAfter, and `idc-runtime prune` runs during the
// outage and right after the consumer is back. Pruning by the window alone would
// delete the committed ids the broker still holds unacknowledged, and the
// redelivery would apply them a second time; bounded by the consumer's
// progress, the job holds back, says why, and the restart applies each id
// exactly once. Once the consumer stopped gracefully the hold is released
// and pruning catches up with the window.
//
// The brokers and databases are created here, before the subtests go
// parallel: newRabbitMQ and dsnEnvFor call t.Setenv, which a parallel test
// may not.
func outageLongerThanTheWindow(t *testing.T, bin string) {
	type run struct {
		b      broker
		db     sinkDB
		dsnEnv string
	}
	var runs []run
	for _, newDB := range sinkDBs {
		for _, b := range outageBrokers(t) {
			db := newDB(t)
			db.createEffects(t)
			runs = append(runs, run{b: b, db: db, dsnEnv: dsnEnvFor(t, db)})
		}
	}
	for _, r := range runs {
		t.Run(r.b.name()+"/"+r.db.dialect(), func(t *testing.T) {
			// Each run is mostly waiting out the outage: together they take
			// as long as one.
			t.Parallel()
			outageRun(t, bin, r.b, r.db, r.dsnEnv, outageScenario{})
		})
	}
}

// outageBrokers are one broker of each kind, private to one run.
func outageBrokers(t *testing.T) []broker {
	return []broker{
		// AckWait 2s: the restarted runtime gets the abandoned deliveries
		// back at once (they waited out the lease during the outage).
		newJetStream(t, 2*time.Second),
		// Kafka is franz-go's in-process kfake cluster (no Kafka server on
		// this machine), over the Kafka protocol on loopback.
		kafkaKeepingRecords(t, newKafka(t, 3)),
		// A quorum queue of RabbitMQ 3.x has no delivery limit.
		newRabbitMQ(t),
		// ClaimMinIdle 1s: the redelivery lease of the pending entries.
		newRedis(t, time.Second),
	}
}

// kafkaKeepingRecords sets retention.ms=-1 on the test topic: records are
// kept (kfake's default would report Kafka's 7 days, a window of two
// weeks), so the derived window is retention.maxReplayAge + safetyMargin.
func kafkaKeepingRecords(t *testing.T, b *kafkaBroker) *kafkaBroker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keep := "-1"
	resps, err := kadm.NewClient(b.cl).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "retention.ms", Value: &keep}}, b.topic)
	if err != nil {
		t.Fatalf("setting retention.ms on %s: %v", b.topic, err)
	}
	for _, r := range resps {
		if r.Err != nil {
			t.Fatalf("setting retention.ms on %s: %v (%s)", r.Name, r.Err, r.ErrMessage)
		}
	}
	return b
}

// pruneReport is the "Prune finished" line of one `idc-runtime prune` run.
type pruneReport struct {
	Msg             string    `json:"msg"`
	Cutoff          time.Time `json:"cutoff"`
	WindowCutoff    time.Time `json:"windowCutoff"`
	RowsDeleted     int64     `json:"rowsDeleted"`
	Window          string    `json:"window"`
	WindowSource    string    `json:"windowSource"`
	HeldBack        bool      `json:"heldBack"`
	HeldFor         string    `json:"heldFor"`
	HeldSince       time.Time `json:"heldSince"`
	HeldBy          []string  `json:"heldBy"`
	HeldReason      string    `json:"heldReason"`
	ProgressRecords int       `json:"progressRecords"`
	BrokerCalls     int       `json:"brokerCalls"`
	ProgressCheckMs int64     `json:"progressCheckMs"`
	Failed          bool      `json:"failed"`
	output          string
}

func (r pruneReport) String() string {
	s := fmt.Sprintf("rowsDeleted=%d heldBack=%t window=%s (%s) progressRecords=%d brokerCalls=%d progressCheckMs=%d",
		r.RowsDeleted, r.HeldBack, r.Window, r.WindowSource, r.ProgressRecords, r.BrokerCalls, r.ProgressCheckMs)
	if r.HeldBack {
		s += fmt.Sprintf(" heldFor=%s heldSince=%s heldBy=%v heldReason=%q", r.HeldFor, r.HeldSince.Format(time.RFC3339), r.HeldBy, r.HeldReason)
	}
	return s
}

// runPrune execs `idc-runtime prune --config FILE` as the CronJob would,
// with the test's environment (which holds the DSN variable), and returns
// its "Prune finished" line. It must exit 0.
func runPrune(t *testing.T, bin, cfgPath string) pruneReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "prune", "--config", cfgPath)
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("idc-runtime prune: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		var r pruneReport
		if json.Unmarshal([]byte(line), &r) == nil && r.Msg == "Prune finished" {
			if r.Failed {
				t.Fatalf("idc-runtime prune logged a failed run:\n%s", out)
			}
			r.output = string(out)
			return r
		}
	}
	t.Fatalf("idc-runtime prune logged no \"Prune finished\" line:\n%s", out)
	return pruneReport{}
}

// nothingAcknowledged checks, on the broker, that the killed runtime
// acknowledged none of what it was handed, and describes what it saw.
func nothingAcknowledged(t *testing.T, b broker, total int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	switch b := b.(type) {
	case *jetStreamBroker:
		info, err := b.info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.AckFloor.Stream != 0 || info.NumAckPending == 0 {
			t.Fatalf("JetStream after the failpoint: ack floor %d, %d ack pending; want 0 and some", info.AckFloor.Stream, info.NumAckPending)
		}
		return fmt.Sprintf("ack floor 0, delivered up to %d, %d ack pending", info.Delivered.Stream, info.NumAckPending)
	case *kafkaBroker:
		// The test's client may go through a blackhole that just closed
		// its connections (settle_outage_test.go): it reconnects.
		var offs kadm.OffsetResponses
		waitFor(t, 15*time.Second, "the group's offsets", func() error {
			var err error
			offs, err = kadm.NewClient(b.cl).FetchOffsets(ctx, b.group)
			return err
		})
		var committed []string
		offs.Each(func(o kadm.OffsetResponse) {
			if o.Err == nil && o.At > 0 {
				committed = append(committed, fmt.Sprintf("%s/%d@%d", o.Topic, o.Partition, o.At))
			}
		})
		if len(committed) > 0 {
			t.Fatalf("Kafka after the failpoint: group %s committed %v; want nothing committed", b.group, committed)
		}
		return "no offset committed by the group"
	case *rabbitBroker:
		// The unacknowledged deliveries are requeued when the dead
		// connection closes: every message is ready again.
		waitFor(t, 20*time.Second, "every message back in the queue", func() error {
			n, err := b.ready()
			if err == nil && n != total {
				err = fmt.Errorf("%d of %d ready", n, total)
			}
			return err
		})
		return fmt.Sprintf("all %d messages ready again (the deliveries were requeued unacknowledged)", total)
	case *redisBroker:
		groups, err := b.rdb.XInfoGroups(ctx, b.stream).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range groups {
			if g.Name == b.group {
				if g.Pending == 0 || g.EntriesRead != g.Pending {
					t.Fatalf("Redis after the failpoint: %d entries read, %d pending; want every read entry pending", g.EntriesRead, g.Pending)
				}
				return fmt.Sprintf("%d entries read, all %d pending (XPENDING)", g.EntriesRead, g.Pending)
			}
		}
		t.Fatalf("group %s not found on %s", b.group, b.stream)
	}
	t.Fatalf("no acknowledgement check for %s", b.name())
	return ""
}

// outageScenario varies how outageRun's first runtime goes down and what
// happens during the outage (settle_outage_test.go); the zero value is the
// failpoint.
type outageScenario struct {
	// first is the source of the first runtime (through a blackhole);
	// nil: the broker's.
	first *config.Source
	// down publishes (publish), runs the first runtime and returns once it
	// is dead with claims committed whose acknowledgements the broker does
	// not have; nil: killed at the after-commit-before-ack failpoint.
	down func(t *testing.T, bin string, cfg *config.Config, db sinkDB, publish func())
	// gone runs once the broker showed nothing acknowledged (re-creating
	// the consumer).
	gone func(t *testing.T)
	// reason lists what the prune held with the replica gone must say too.
	reason []string
}

func outageRun(t *testing.T, bin string, b broker, db sinkDB, dsnEnv string, sc outageScenario) {
	began := time.Now()
	ctx := context.Background()
	cfg := appendConfig(b.sourceConfig(), dsnEnv)
	db.point(cfg)
	// A short derived window: every broker here leaves a horizon unbounded
	// (JetStream: no max_age and max_deliver -1; Kafka: retention.ms -1;
	// RabbitMQ 3.x quorum queue: no delivery limit; Redis: always), so
	// maxReplayAge bounds it and W = maxReplayAge + safetyMargin.
	cfg.Retention.Mode = retention.ModeDerived
	cfg.Retention.Window = config.Duration{}
	cfg.Retention.MaxConsumerOutage = config.Duration{Duration: time.Second}
	cfg.Retention.SafetyMargin = config.Duration{Duration: time.Second}
	cfg.Retention.MaxReplayAge = config.Duration{Duration: 3 * time.Second}
	derived, err := retention.Derive(ctx, cfg, nil, time.Now())
	if err != nil {
		t.Fatalf("deriving the window: %v", err)
	}
	w := derived.Window
	if w <= 0 || w > 10*time.Second {
		t.Fatalf("derived window %s, want a few seconds (%s)", w, derived.DerivedFrom)
	}
	t.Logf("%s: derived window W=%s from %s", b.name(), w, derived.DerivedFrom)
	pruneCfg := writeConfig(t, cfg)
	store, err := sink.InboxFor(db.seam(t), cfg)
	if err != nil {
		t.Fatal(err)
	}

	// 1. Commit a batch, die before acknowledging it.
	var msgs []outgoing
	for _, e := range plainEvents(outageMessages) {
		msgs = append(msgs, e.outgoing())
	}
	first := *cfg
	if sc.first != nil {
		first.Source = *sc.first
	}
	if sc.down == nil {
		sc.down = killedAtTheFailpoint
	}
	sc.down(t, bin, &first, db, func() { b.publish(t, msgs) })
	killedAt := time.Now()
	// Another lane's COMMIT may have been on its way when the process died:
	// count once the database has closed every session of the dead process.
	waitFor(t, 20*time.Second, "the killed runtime's database sessions to end", func() error {
		if n := db.runtimeSessions(t); n != 0 {
			return fmt.Errorf("%d sessions left", n)
		}
		return nil
	})
	committed := db.queryInt(t, "SELECT count(*) FROM "+db.table("effects"))
	inboxRows, _ := db.claims(t, "inbox_orders")
	if committed == 0 || committed > outageMessages || inboxRows != committed {
		t.Fatalf("after the failpoint: %d effects, %d inbox rows of %d messages; want a committed batch, one inbox row each", committed, inboxRows, outageMessages)
	}
	committedIDs := db.claimedIDs(t, "inbox_orders")
	acked := nothingAcknowledged(t, b, outageMessages)
	t.Logf("%s: killed after committing %d effects; broker: %s", b.name(), committed, acked)
	if sc.gone != nil {
		sc.gone(t)
	}

	// kept fails unless every id committed before the kill is still in the
	// inbox. It reports with Errorf, so a broken hold also shows what the
	// redelivery then does (the doubled effects).
	kept := func(when string, r pruneReport) {
		t.Helper()
		n := db.countClaimed(t, "inbox_orders", committedIDs)
		if n != len(committedIDs) || r.RowsDeleted != 0 {
			t.Errorf("%s: prune %s deleted %d rows: %d of the %d ids committed and never acknowledged are left in the inbox\n%s",
				b.name(), when, r.RowsDeleted, n, len(committedIDs), r.output)
		}
	}

	// 2. The outage. A prune run once it lasted 4×W (the replica is silent
	// but not stale yet), and one once it counts as gone.
	time.Sleep(time.Until(killedAt.Add(4 * w)))
	early := runPrune(t, bin, pruneCfg)
	t.Logf("%s: prune after %s down: %s", b.name(), time.Since(killedAt).Truncate(time.Second), early)
	kept("during the outage (replica silent)", early)
	if !early.HeldBack || !strings.Contains(early.HeldReason, "idc-runtime-test-0") {
		t.Errorf("%s: prune during the outage did not say it held back for the replica: %s", b.name(), early)
	}
	// The record goes stale counted from its last heartbeat, which can be
	// a few seconds before the kill was seen here on a busy machine: the
	// outage step 3 asserts is also waited for.
	waitFor(t, 2*retention.StaleAfter, "the killed replica's progress record to go stale and the outage to pass StaleAfter and 4×W", func() error {
		if n := db.staleProgress(t, "inbox_orders_progress", retention.StaleAfter+time.Second); n == 0 {
			return fmt.Errorf("no stale progress record")
		}
		if down := time.Since(killedAt); down <= retention.StaleAfter || down < 4*w {
			return fmt.Errorf("down for %s only", down)
		}
		return nil
	})
	held := runPrune(t, bin, pruneCfg)
	t.Logf("%s: prune after %s down: %s", b.name(), time.Since(killedAt).Truncate(time.Second), held)
	kept("during the outage (replica gone)", held)
	if !held.HeldBack || !strings.Contains(held.HeldReason, "idc-runtime-test-0") ||
		!strings.Contains(held.HeldReason, "stopped without acknowledging") || held.HeldFor == "" || held.BrokerCalls < 1 || !containsAll(held.HeldReason, sc.reason) {
		t.Errorf("%s: prune with the replica gone: want heldBack, heldFor and a reason naming the replica that stopped without acknowledging, read from the broker, saying %q: %s",
			b.name(), sc.reason, held)
	}
	if n, _ := db.claims(t, "inbox_orders"); n != inboxRows {
		t.Errorf("%s: %d inbox rows after pruning during the outage, want the %d there were", b.name(), n, inboxRows)
	}
	last, err := store.LastPruneRun(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if last == nil || last.HeldReason == "" || last.HeldSince == nil || !last.Cutoff.Before(last.WindowCutoff) || last.RowsDeleted != 0 {
		t.Errorf("%s: last recorded prune run %+v: want held_reason and held_since set, cutoff before window_cutoff, nothing deleted", b.name(), last)
	} else {
		t.Logf("%s: <inbox>_prune_runs: cutoff %s < window_cutoff %s (%s earlier), held_since %s, held_reason %q", b.name(),
			last.Cutoff.Format(time.RFC3339), last.WindowCutoff.Format(time.RFC3339), last.WindowCutoff.Sub(last.Cutoff).Truncate(time.Second),
			last.HeldSince.Format(time.RFC3339), last.HeldReason)
	}

	// 3. The consumer comes back; the broker redelivers.
	outage := time.Since(killedAt)
	if outage < 4*w || outage <= retention.StaleAfter {
		t.Fatalf("outage %s, want at least 4×W=%s and longer than %s", outage, 4*w, retention.StaleAfter)
	}
	t.Logf("%s: consumer down %s (%.1f×W)", b.name(), outage.Truncate(time.Second), float64(outage)/float64(w))
	gone := unstoppedReplicas(t, store)
	p2 := startBinary(t, bin, cfg)
	p2.waitStatus(t, "/readyz", 200, 60*time.Second)
	logProgressRows(t, b.name()+": progress records before the prune right after the restart", store)
	back := runPrune(t, bin, pruneCfg)
	t.Logf("%s: prune right after the restart: %s", b.name(), back)
	// This prune races the restarted replica taking the redeliveries, on
	// either database: while the broker shows any of the killed replica's
	// deliveries unsettled it holds back; once the broker shows them settled
	// (the restarted replica found the ids claimed and acknowledged them
	// again, and the broker confirmed it) it retires the record, and the
	// window alone bounds the ids committed before the kill. Which of the two
	// a run sees is timing; the ids may go only on that evidence.
	if facts, ok := settledOnEvidence(back.output, gone); ok {
		if left := unstoppedReplicas(t, store); containsAny(left, gone) {
			t.Errorf("%s: the prune right after the restart logged replicas %v settled, but their progress records are still there: %v", b.name(), gone, left)
		}
		t.Logf("%s: the prune right after the restart released the hold of %v on the broker's evidence (%s): %d of the %d ids committed before the kill are left",
			b.name(), gone, strings.Join(facts, "; "), db.countClaimed(t, "inbox_orders", committedIDs), len(committedIDs))
	} else {
		kept("right after the restart (the broker not showing the killed replica's deliveries settled yet)", back)
		t.Logf("%s: the prune right after the restart still held back for %v (the broker did not show their deliveries settled yet)", b.name(), gone)
	}
	waitFor(t, 90*time.Second, "every message applied", func() error {
		if _, n, _ := db.effects(t, "effects", "message_id"); n < outageMessages {
			return fmt.Errorf("%d of %d ids applied", n, outageMessages)
		}
		return nil
	})
	waitFor(t, 60*time.Second, "every message acknowledged", func() error { return b.drained(ctx) })
	expectCleanExit(t, p2, p2.terminate(t))
	checkExactlyOnce(t, db, b, outageMessages)

	// 4. Stopped gracefully with everything acknowledged: the hold goes (the
	// broker's reading may lag: RabbitMQ's management statistics by ~5s)
	// and the window alone bounds pruning again.
	var after pruneReport
	released := time.Now()
	waitFor(t, 60*time.Second, "the prune job to stop holding back", func() error {
		after = runPrune(t, bin, pruneCfg)
		if after.HeldBack {
			time.Sleep(time.Second)
			return fmt.Errorf("still held: %s", after)
		}
		return nil
	})
	t.Logf("%s: prune after the graceful stop (%s to release): %s", b.name(), time.Since(released).Truncate(100*time.Millisecond), after)
	last, err = store.LastPruneRun(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if last == nil || last.HeldReason != "" || !last.Cutoff.Equal(last.WindowCutoff) {
		t.Errorf("%s: last recorded prune run %+v: want no hold, cutoff = window_cutoff", b.name(), last)
	} else {
		old := db.claimedBefore(t, "inbox_orders", last.WindowCutoff)
		left := db.countClaimed(t, "inbox_orders", committedIDs)
		if old != 0 || left != 0 {
			t.Errorf("%s: after the released prune %d inbox rows older than the window remain, %d of the ids committed before the kill", b.name(), old, left)
		}
	}
	t.Logf("%s: W=%s, down %s, %d committed before the kill and kept through the outage, released run deleted %d; took %s",
		b.name(), w, outage.Truncate(time.Second), committed, after.RowsDeleted, time.Since(began).Truncate(time.Second))
	appendVerdict(t, db, "outage/"+b.name(), 1, 1, outageMessages, outageMessages).judge(t, db)
}

// killedAtTheFailpoint publishes, and runs the runtime until it kills
// itself between its first COMMIT and the ack.
func killedAtTheFailpoint(t *testing.T, bin string, cfg *config.Config, _ sinkDB, publish func()) {
	publish()
	p := startBinary(t, bin, cfg, "IDC_FAILPOINT=after-commit-before-ack")
	st := p.wait(t, 60*time.Second)
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("exit state %s, want killed by SIGKILL\n%s", st, p.logs.String())
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
