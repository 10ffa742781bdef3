package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// pipelineNode is one replica of a pipeline stage run by the real binary.
type pipelineNode struct {
	name  string
	cfg   config.Config
	stage string // "a" or "b"
	armed string // the failpoint of the current process, if any
	proc  *process
}

// pipelineChaos is the chaos run of the two-stage pipeline, short (3,000
// orders) in make test and long (40,000 orders + 20% duplicates = 50,000
// messages, >= 30 kills, >= 5 at a failpoint) with IDC_CHAOS=long: two replicas of each stage as real
// idc-runtime processes; while stage A's input drains, random replicas are
// SIGKILLed and restarted, some armed to kill themselves between COMMIT
// and ack, some (stage A) after COMMIT with events in the outbox and before
// the relay published them, some between the relay's publish and
// mark-sent (the long form waits until each kind fired). Then
// everything runs unarmed until both stages drained, and the database alone
// must show one row in B per original order, B's inbox holding each event
// id once, and A's orders at each key's highest version. It runs on each
// sink database (sinkDB).
func pipelineChaos(t *testing.T, bin string, db sinkDB) {
	unique, minKills, minFailpoints := 3000, 6, 1
	if os.Getenv("IDC_CHAOS") == "long" { // make test-chaos: 50,000 messages
		unique, minKills, minFailpoints = 40000, 30, 5
	}
	in := newJetStream(t, 2*time.Second)
	mid := newJetStream(t, 2*time.Second)
	shortenDuplicateWindow(t, mid) // republished events reach B's inbox
	db.createPipeline(t)
	a := stageAConfig(in.sourceConfig(), dsnEnvFor(t, db), mid.subject+".projected", config.EmitAlways)
	b := stageBConfig(mid.sourceConfig(), a.Sink.DSNEnv)
	db.point(a)
	db.point(b)
	migrateInbox(t, db, a)
	migrateInbox(t, db, b)
	orders := keyedEvents(unique, 100)
	msgs := withDuplicates(orders, dupShare, rand.New(rand.NewPCG(9, 10)))

	rng := rand.New(rand.NewPCG(11, 12))
	nodes := []*pipelineNode{{name: "a0", cfg: *a, stage: "a"}, {name: "a1", cfg: *a, stage: "a"}, {name: "b0", cfg: *b, stage: "b"}, {name: "b1", cfg: *b, stage: "b"}}
	start := func(n *pipelineNode, armed string) {
		cfg := n.cfg
		var env []string
		if armed != "" {
			env = append(env, "IDC_FAILPOINT="+armed)
		}
		n.proc, n.armed = startBinary(t, bin, &cfg, env...), armed
	}
	for _, n := range nodes {
		start(n, "")
	}
	// Publish in bursts while the faults run, so replicas are mid-batch.
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := 0; i < len(msgs); i += 250 {
			in.publish(t, msgs[i:min(i+250, len(msgs))])
			time.Sleep(150 * time.Millisecond)
		}
	}()
	kills, failpointKills := 0, 0
	byFailpoint := map[string]int{}
	exited := func(n *pipelineNode) bool {
		select {
		case <-n.proc.exited:
			return true
		default:
			return false
		}
	}
	failpointKinds := []string{"after-commit-before-ack", "relay-before-publish", "relay-after-publish-before-mark"}
	everyKind := func() bool {
		if minFailpoints < len(failpointKinds) {
			return true // the short form cannot wait for each kind
		}
		for _, k := range failpointKinds {
			if byFailpoint[k] == 0 {
				return false
			}
		}
		return true
	}
	done := func() bool {
		select {
		case <-published:
			return kills+failpointKills >= minKills && failpointKills >= minFailpoints && everyKind()
		default:
			return false
		}
	}
	for !done() {
		time.Sleep(time.Duration(150+rng.IntN(350)) * time.Millisecond)
		for _, n := range nodes {
			if exited(n) { // a failpoint fired
				if ws, ok := n.proc.state.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
					t.Fatalf("%s exited with %s, not by its failpoint", n.name, n.proc.state)
				}
				failpointKills++
				byFailpoint[n.armed]++
				start(n, "")
			}
		}
		victim := nodes[rng.IntN(len(nodes))]
		if !exited(victim) {
			_ = victim.proc.cmd.Process.Kill()
			<-victim.proc.exited
			kills++
		}
		armed := ""
		switch rng.IntN(4) {
		case 0:
			armed = "after-commit-before-ack"
		case 1:
			if victim.stage == "a" {
				// Dies with events committed in the outbox and not yet
				// published: the other replica's relay, or its own
				// restart, must publish them.
				armed = "relay-before-publish"
			}
		case 2:
			if victim.stage == "a" {
				armed = "relay-after-publish-before-mark"
			}
		}
		start(victim, armed)
		if kills > 10*minKills {
			t.Fatalf("%d kills and only %d failpoint kills: the failpoints do not fire", kills, failpointKills)
		}
	}
	// Faults stop: every replica unarmed.
	for _, n := range nodes {
		if exited(n) {
			failpointKills++
			byFailpoint[n.armed]++
			start(n, "")
			continue
		}
		_ = n.proc.cmd.Process.Kill()
		<-n.proc.exited
		kills++
		start(n, "")
	}
	time.Sleep(2 * stageBDuplicateWindow)
	waitFor(t, 120*time.Second, "both stages to drain", func() error {
		for _, n := range nodes {
			if exited(n) {
				return fmt.Errorf("%s exited: %s", n.name, n.proc.state)
			}
		}
		ctx := context.Background()
		if err := in.drained(ctx); err != nil {
			return err
		}
		if n := db.queryInt(t, "SELECT count(*) FROM "+db.table("inbox_projector_outbox")+" WHERE sent_at IS NULL"); n != 0 {
			return fmt.Errorf("%d outbox rows unsent", n)
		}
		return mid.drained(ctx)
	})
	for _, n := range nodes {
		expectCleanExit(t, n.proc, n.proc.terminate(t))
	}
	rows, ids, doubled := db.effects(t, "projected", "source_id")
	events, distinctEvents := db.claims(t, "inbox_audit")
	dead := db.queryInt(t, "SELECT (SELECT count(*) FROM "+db.table("inbox_projector_dead_letters")+") + (SELECT count(*) FROM "+db.table("inbox_audit_dead_letters")+")")
	stale := staleOrders(t, db, orders)
	t.Logf("failpoint kills by kind: %v", byFailpoint)
	line := fmt.Sprintf("PIPELINE kills=%d failpointKills=%d published=%d stageB=%d unique=%d final=%d doubled=%d lost=%d stale=%d db=%s",
		kills+failpointKills, failpointKills, len(msgs), streamMessages(t, mid), unique, ids, doubled, unique-ids, stale, db.dialect())
	fmt.Println(line)
	t.Log(line)
	if rows != unique || ids != unique || doubled != 0 {
		t.Errorf("stage B: %d rows over %d original orders (%d doubled), want exactly %d, one each", rows, ids, doubled, unique)
	}
	if events != distinctEvents || events != unique {
		t.Errorf("stage B's inbox: %d rows, %d distinct; want %d of each", events, distinctEvents, unique)
	}
	if stale != 0 {
		t.Errorf("stage A: %d keys of orders not at their highest version", stale)
	}
	if dead != 0 {
		t.Errorf("%d dead letters, want none", dead)
	}
}

// staleOrders counts the keys whose orders row (stage A's upsert) is
// missing or not at the highest version published for the key.
func staleOrders(t *testing.T, db sinkDB, orders []event) int {
	t.Helper()
	top := map[string]int{}
	for _, e := range orders {
		top[e.Key] = max(top[e.Key], e.Version)
	}
	got := db.versions(t, "orders", "order_id", "version")
	stale := 0
	for k, v := range top {
		if g, ok := got[k]; !ok || g != v {
			stale++
		}
	}
	return stale + max(len(got)-len(top), 0)
}
