package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/testbin"
	"github.com/idempotency-dev/idc-operator/runtime/redrive"
)

// TestRedriveExactlyOnce: 1,000 messages through JetStream, 100 of them
// poisoned by a CHECK constraint the effect table has for the test. Once the
// constraint is fixed, the real `idc-runtime redrive` runs twice at the same
// time, while 2 live replicas consume 1,000 more messages (among them 10
// producer re-sends of poisoned ids, so the live path and redrive race on
// those ids). Afterwards: exactly one effect row per id, no dead letter left,
// and every dead letter settled once across both runs.
func TestRedriveExactlyOnce(t *testing.T) {
	bin := testbin.Build(t, testbin.RuntimePackage, "idc-runtime")
	b := newJetStream(t, 30*time.Second)
	db := newDatabase(t)
	db.exec(t, "CREATE SCHEMA app", effectsTable,
		// The bug in the effect: every n ending in 7 violates it.
		"ALTER TABLE app.effects ADD CONSTRAINT poison CHECK (n % 10 <> 7)")
	cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
	cfg.Delivery.MaxAttempts = 2
	migrateInbox(t, db, cfg)

	first := plainEvents(2000)
	msgs := make([]outgoing, 0, 1000)
	for _, e := range first[:1000] {
		msgs = append(msgs, e.outgoing())
	}
	b.publish(t, msgs)
	rs := []*runner{startRunner(t, cfg, db, "replica-0"), startRunner(t, cfg, db, "replica-1")}
	waitSettled(t, 1000, 120*time.Second, rs...)
	if dl := db.queryInt(t, "SELECT count(*) FROM app.inbox_orders_dead_letters"); dl != 100 {
		t.Fatalf("%d dead letters after the poisoned run, want 100", dl)
	}
	if n := db.queryInt(t, "SELECT count(*) FROM app.effects"); n != 900 {
		t.Fatalf("%d effects after the poisoned run, want 900", n)
	}
	if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_orders_dead_letters WHERE reason_class = 'database'"); n != 100 {
		t.Fatalf("%d of 100 dead letters have reason class database", n)
	}

	db.exec(t, "ALTER TABLE app.effects DROP CONSTRAINT poison") // the fix
	more := make([]outgoing, 0, 1010)
	for i, e := range first[1000:] {
		more = append(more, e.outgoing())
		if i%100 == 50 { // a producer re-sends a poisoned id
			more = append(more, first[i/100*10+7].outgoing())
		}
	}
	cfgPath := writeConfig(t, cfg)
	var wg sync.WaitGroup
	results := make([]redrive.Result, 2)
	errs := make([]error, 2)
	// The replicas consume these while both redrives run.
	b.publish(t, more)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = runRedrive(bin, cfgPath, fmt.Sprintf("it-%d", i), "--reason", "database")
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("redrive %d: %v", i, err)
		}
	}
	waitSettled(t, 1000+len(more), 120*time.Second, rs...)
	for _, r := range rs {
		r.stop(t)
	}

	settled := 0
	for i, res := range results {
		t.Logf("redrive %d: %+v", i, res)
		if res.Selected > 100 || res.StillFailing != 0 || res.Unusable != 0 || res.Stale != 0 {
			t.Errorf("redrive %d: %+v; want at most 100 selected, none failing, unusable or stale", i, res)
		}
		settled += res.Applied + res.Duplicates
	}
	if settled != 100 {
		t.Errorf("the two runs settled %d dead letters together, want 100 (each once)", settled)
	}
	if twice := db.queryInt(t, "SELECT count(*) FROM (SELECT dead_letter_id FROM app.inbox_orders_redrives GROUP BY 1 HAVING count(*) > 1) d"); twice != 0 {
		t.Errorf("%d dead letters recorded by more than one redrive", twice)
	}
	if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_orders_redrives WHERE outcome IN ('applied', 'duplicate')"); n != 100 {
		t.Errorf("%d settled rows in app.inbox_orders_redrives, want 100", n)
	}
	checkExactlyOnce(t, db, b, 2000)

	// A third run finds nothing left.
	res, err := runRedrive(bin, cfgPath, "it-again")
	if err != nil || res.Selected != 0 {
		t.Errorf("a third redrive: %+v, %v; want nothing selected", res, err)
	}
}

func writeConfig(t *testing.T, cfg any) string {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runRedrive runs `idc-runtime redrive` and parses the JSON line it prints.
func runRedrive(bin, cfgPath, run string, args ...string) (redrive.Result, error) {
	var res redrive.Result
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, append([]string{"redrive", "--config", cfgPath, "--run", run}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("%w\n%s", err, stderr.String())
	}
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &res); err != nil {
		return res, fmt.Errorf("parsing %q: %w", stdout.String(), err)
	}
	return res, nil
}
