package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// inboxOwnedAcrossNamespaces is issue 33's case as a new user would try it
// on the real node: a second namespace with its own Secret holding the
// same DSN as orders-projector's, and an IdempotentConsumer there on the
// same schema and inbox table, its own durable on the same stream, an
// append effect and deletionPolicy Delete. The inbox's meta row names its
// owner, so the second resource is refused (Conflict, shown by `kubectl get
// idc -A`), claims nothing, and `kubectl delete` of it leaves the owner's
// inbox, every claim and its Ready condition untouched.
func (s *suite) inboxOwnedAcrossNamespaces(ctx context.Context, t *testing.T) {
	owner := s.get(ctx, t, s.orders)
	table := string(owner.Spec.Sink.Inbox.Table)
	schema := owner.Spec.Sink.Schema()
	var ownerSecret corev1.Secret
	if err := s.c.Client.Get(ctx, client.ObjectKey{Namespace: testNamespace, Name: owner.Spec.Sink.ConnectionSecretRef().Name}, &ownerSecret); err != nil {
		t.Fatal(err)
	}
	tenant := "idc-e2e-tenant-" + s.suffix
	if err := s.c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}); err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() {
		_ = s.c.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}})
	})
	dsnKey := owner.Spec.Sink.ConnectionSecretRef().Key
	if err := s.c.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "tenant-db"},
		Data: map[string][]byte{"url": ownerSecret.Data[dsnKey]}}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, s.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	claims := func() int {
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, table}.Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := claims()

	nats := owner.Spec.Source.NATSJetStream
	manifest := fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: tenant-orders, namespace: %s}
spec:
  source:
    natsJetStream: {url: %q, stream: %s, consumer: tenant-orders}
  message:
    id: {header: Nats-Msg-Id}
  sink:
    postgres: {connectionSecretRef: {name: tenant-db, key: url}, schema: %s}
    inbox: {table: %s, deletionPolicy: Delete}
    effect:
      append: {table: tenant_orders, columns: {payload: "@payload"}}
  retention: {maxReplayAge: 48h}
`, tenant, nats.URL, nats.Stream, schema, table)
	file := filepath.Join(t.TempDir(), "tenant-orders.yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.KubectlCmd(ctx, "apply", "-f", file); err != nil {
		t.Fatal(err)
	}
	rival := &messagingv1alpha1.IdempotentConsumer{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "tenant-orders"}}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	got, err := localcluster.WaitFor(wctx, s.c.Client, client.ObjectKeyFromObject(rival), func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		return localcluster.Condition(idc, messagingv1alpha1.ConditionStalled) == "True/"+messagingv1alpha1.ReasonConflict
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := meta.FindStatusCondition(got.Status.Conditions, messagingv1alpha1.ConditionStalled).Message
	if !strings.Contains(msg, testNamespace+"/"+owner.Name) || !strings.Contains(msg, messagingv1alpha1.AnnotationAdoptInboxFrom) {
		t.Fatalf("the Conflict message does not name the owner and the adopt annotation: %s", msg)
	}
	listing, err := s.c.KubectlCmd(ctx, "get", "idc", "-A", "-o", "wide")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl get idc -A -o wide:\n%s", listing)
	var row string
	for _, l := range strings.Split(listing, "\n") {
		if strings.HasPrefix(l, tenant+" ") {
			row = l
		}
	}
	if !strings.Contains(row, "tenant-orders") || !strings.Contains(row, "False") || !strings.Contains(row, messagingv1alpha1.ReasonConflict) {
		t.Fatalf("kubectl get idc -A does not show the refusal (Ready False, reason Conflict): %q", row)
	}
	if n := claims(); n != before {
		t.Fatalf("the refused resource changed the owner's inbox: %d claims, was %d", n, before)
	}

	if out, err := s.c.KubectlCmd(ctx, "-n", tenant, "delete", "idc", "tenant-orders", "--wait=true", "--timeout=2m"); err != nil {
		t.Fatalf("kubectl delete: %v\n%s", err, out)
	}
	if err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(rival), &messagingv1alpha1.IdempotentConsumer{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the refused resource is still there: %v", err)
	}
	if n := claims(); n != before {
		t.Fatalf("deleting the refused resource (deletionPolicy Delete) changed the owner's inbox: %d claims, was %d", n, before)
	}
	if c := localcluster.Condition(s.get(ctx, t, owner), messagingv1alpha1.ConditionInboxReady); c != "True/"+messagingv1alpha1.ReasonProvisioned {
		t.Fatalf("the owner after the delete: InboxReady %s", c)
	}
	t.Logf("tenant-orders in %s refused (%s); kubectl delete of it left %s.%s with its %d claims and %s InboxReady", tenant, msg, schema, table, before, owner.Name)
}
