package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// mysqlSink: an IdempotentConsumer with a MariaDB sink, applied as YAML:
// the manager provisions its inbox through the account the Secret names
// (the controller's grant on one database, nothing else), two replicas run
// the orders scenario (duplicates, re-sends, versions out of order, two
// poison messages) and every unique id takes effect once with each order at
// its highest version; a prune Job runs and status.lastPrune shows it;
// deleting the resource (deletionPolicy Delete) drops the inbox's tables
// and keeps the user's effect table.
func (s *suite) mysqlSink(ctx context.Context, t *testing.T) {
	name, db := "orders-mariadb", "idc_e2e_"+s.suffix+"_my"
	stream, subject := "IDC_E2E_MY_"+strings.ToUpper(s.suffix), "idc-e2e-my-"+s.suffix+".orders"
	sink, err := localcluster.PrepareMySQLSink(ctx, db, "orders")
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() {
		if !t.Failed() {
			_ = sink.Drop(context.Background())
		}
	})
	nc, js, err := localcluster.ConnectJetStream()
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(nc.Close)
	if err := localcluster.RecreateOrdersStream(ctx, js, stream, subject); err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	s.secret(ctx, t, name+"-db", map[string]string{"dsn": sink.PodDSN})
	idc := s.apply(ctx, t, fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: %[1]s}
spec:
  source:
    natsJetStream: {url: %[2]q, stream: %[3]s, consumer: %[1]s, filterSubject: "%[4]s.>"}
  message:
    id: {header: Nats-Msg-Id}
    entity: {key: {jsonPath: $.orderId}, sequence: {jsonPath: $.version}}
  sink:
    mysql: {connectionSecretRef: {name: %[1]s-db, key: dsn}, database: %[5]s}
    inbox: {table: inbox_orders_mariadb, deletionPolicy: Delete}
    effect:
      upsert:
        table: orders
        key: [order_id]
        sequenceColumn: version
        columns: {order_id: $.orderId, status: $.status, version: $.version}
  delivery: {batchSize: 100, maxWait: 100ms, maxAttempts: 3}
  retention: {maxConsumerOutage: 1h, safetyMargin: 10m}
  runtime: {replicas: 2}
`, name, localcluster.PodNATSURL, stream, subject, db))
	idc = s.waitReady(ctx, t, idc, 2)
	if idc.Status.Inbox == nil || !strings.Contains(idc.Status.Inbox.Table, "inbox_orders_mariadb") {
		t.Fatalf("status.inbox = %+v, want the MariaDB inbox", idc.Status.Inbox)
	}

	w := localcluster.NewWorkload(60, 4, 0.4, 7)
	stats, err := w.Publish(ctx, js, subject, nil)
	if err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := localcluster.WaitDrained(dctx, js, stream, name, nil); err != nil {
		t.Fatal(err)
	}
	out, err := sink.Verify(ctx, w, "inbox_orders_mariadb")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MariaDB sink: published %+v; outcome %+v", stats, out)
	if !out.OK() || out.DeadLetterRows != len(w.Poison) {
		t.Fatalf("not exactly one effect per id on MariaDB (dead letters %d, want %d): %+v", out.DeadLetterRows, len(w.Poison), out)
	}

	j, _ := s.runPruneJob(ctx, t, idc, "e2e-prune-my-"+s.suffix)
	pctx, cancel2 := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel2()
	idc, err = localcluster.WaitFor(pctx, s.c.Client, client.ObjectKeyFromObject(idc), func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		lp := idc.Status.LastPrune
		return lp != nil && lp.Time != nil && !lp.Time.Before(j.Status.StartTime)
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lp := idc.Status.LastPrune; lp.RowsDeleted != 0 {
		t.Fatalf("the prune deleted %d rows inside the window", lp.RowsDeleted)
	}
	t.Logf("status.lastPrune on MariaDB: time=%s cutoff=%s rowsDeleted=%d", idc.Status.LastPrune.Time, idc.Status.LastPrune.Cutoff, idc.Status.LastPrune.RowsDeleted)

	before, err := sink.Tables(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !before["inbox_orders_mariadb"] || !before["inbox_orders_mariadb_meta"] {
		t.Fatalf("tables before deletion: %v; want the inbox and its meta table", before)
	}
	if err := s.c.Client.Delete(ctx, idc); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		if err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(idc), &messagingv1alpha1.IdempotentConsumer{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s still there (%w)", idc.Name, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	after, err := sink.Tables(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for tbl := range after {
		if strings.HasPrefix(tbl, "inbox_orders_mariadb") {
			t.Fatalf("deletionPolicy Delete: %s is still there (tables: %v)", tbl, after)
		}
	}
	if !after["orders"] {
		t.Fatalf("the effect table (the user's) was dropped: %v", after)
	}
	t.Logf("deletionPolicy Delete dropped %d inbox tables on MariaDB and kept the effect table", len(before)-len(after))
}
