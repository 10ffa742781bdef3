package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// inboxLost is issue 33's fail-closed proof with the real binary, on
// JetStream and PostgreSQL: a running consumer whose inbox is dropped
// behind its back holds within its check interval (5 s), idle or not:
// /readyz fails with inbox_lost, nothing is fetched, claimed or
// acknowledged, and the tables are never re-created. Once a person accepts
// the loss (the controller's MigrateFor with AcceptLoss, as the accept
// annotation does) and the pods roll onto the new epoch, the consumer
// continues: what docs/operate.md promises, every message the broker still
// holds applied once, the ones from before the loss included.
func inboxLost(t *testing.T, bin string) {
	ctx := context.Background()
	b := newJetStream(t, 2*time.Second)
	db := newDatabase(t)
	db.exec(t, "CREATE SCHEMA app", effectsTable)
	cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
	owner := inbox.Owner{Cluster: "test", Namespace: "integration", Name: "orders", UID: "u-1"}
	store, err := inbox.ForConfig(db.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	id, err := store.MigrateFor(ctx, &inbox.OwnerClaim{Owner: owner})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Sink.InboxEpoch = id.Epoch

	events := plainEvents(150)
	publish := func(evs []event) {
		msgs := make([]outgoing, len(evs))
		for i, e := range evs {
			msgs[i] = e.outgoing()
		}
		b.publish(t, msgs)
	}
	publish(events[:100])
	p := startBinary(t, bin, cfg)
	waitFor(t, 60*time.Second, "the first 100 applied and acknowledged", func() error {
		if n := db.queryInt(t, "SELECT count(*) FROM app.effects"); n != 100 {
			return fmt.Errorf("%d effects", n)
		}
		return b.drained(ctx)
	})

	var drops []string
	for _, tbl := range inbox.NamesFor(cfg.Sink).Tables() {
		drops = append(drops, fmt.Sprintf("DROP TABLE IF EXISTS app.%s", tbl))
	}
	db.exec(t, drops...)
	lostAt := time.Now()
	body := p.waitStatus(t, "/readyz", http.StatusServiceUnavailable, 20*time.Second)
	if !strings.Contains(body, "inbox_lost") {
		t.Fatalf("/readyz while the inbox is lost: %q, want inbox_lost", body)
	}
	t.Logf("held %s after the DROP: %s", time.Since(lostAt).Round(100*time.Millisecond), strings.TrimSpace(body))
	metrics := p.waitStatus(t, "/metrics", http.StatusOK, 5*time.Second)
	if !strings.Contains(metrics, `idc_sink_misconfigured{reason="inbox_lost",sink_kind="postgres"} 1`) {
		t.Fatalf("/metrics lacks idc_sink_misconfigured{reason=\"inbox_lost\",sink_kind=\"postgres\"} 1")
	}

	// 50 redelivered ids from before the loss and 50 new ones.
	publish(events[50:150])
	// Two check intervals: the held replica neither claims nor acks.
	time.Sleep(10 * time.Second)
	info, err := b.info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A pull request already waiting may have been handed messages: they
	// stay unacknowledged, and come back after AckWait.
	if acked := int(info.Delivered.Consumer) - info.NumAckPending; acked != 100 || int(info.NumPending)+info.NumAckPending != 100 {
		t.Fatalf("while held: %d acknowledged (want the first 100 only), %d pending + %d ack pending (want the 100 new ones)", acked, info.NumPending, info.NumAckPending)
	}
	if n := db.queryInt(t, "SELECT count(*) FROM app.effects"); n != 100 {
		t.Fatalf("%d effects while held, want 100", n)
	}
	if n := db.queryInt(t, "SELECT count(*) FROM pg_tables WHERE schemaname = 'app' AND tablename LIKE 'inbox_orders%'"); n != 0 {
		t.Fatalf("%d inbox tables re-created behind the person's back", n)
	}
	t.Logf("held for 10 s with 100 messages waiting: 0 claimed, 0 acknowledged (%d handed to a pull request already waiting), 0 tables re-created", info.NumAckPending)

	accepted, err := store.MigrateFor(ctx, &inbox.OwnerClaim{Owner: owner, Epoch: id.Epoch, AcceptLoss: true})
	if err != nil {
		t.Fatal(err)
	}
	expectCleanExit(t, p, p.terminate(t))
	cfg.Sink.InboxEpoch = accepted.Epoch
	p2 := startBinary(t, bin, cfg)
	waitFor(t, 60*time.Second, "the backlog applied and acknowledged", func() error {
		if n := db.queryInt(t, "SELECT count(*) FROM app.effects"); n != 200 {
			return fmt.Errorf("%d effects", n)
		}
		return b.drained(ctx)
	})
	expectCleanExit(t, p2, p2.terminate(t))
	twice := db.queryInt(t, "SELECT count(*) FROM (SELECT message_id FROM app.effects GROUP BY message_id HAVING count(*) > 1) d")
	unique := db.queryInt(t, "SELECT count(DISTINCT message_id) FROM app.effects")
	if twice != 50 || unique != 150 {
		t.Fatalf("after accepting: %d ids applied twice, %d unique; want exactly the 50 redelivered from before the loss twice, 150 unique", twice, unique)
	}
	t.Logf("after accepting (epoch %s -> %s): 200 effects, 150 unique ids, the 50 from before the loss applied again, as accepting says", id.Epoch, accepted.Epoch)
}
