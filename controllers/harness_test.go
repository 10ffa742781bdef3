package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// The phases run here against fakes of the sink database and the broker
// and controller-runtime's fake client: no cluster, no database. The
// envtest suites run the same reconciler against a real API server,
// PostgreSQL and brokers.

// fakeSink is a SinkDB that records calls and answers from its fields.
type fakeSink struct {
	mu        sync.Mutex
	calls     map[string]int
	ensureErr error
	effectErr error
	dropErr   error
	// lastPruneErr fails LastPrune (the runtime's records unreadable).
	lastPruneErr error
	stored       *retention.Applied
	released     []string
	dsn          string // of the last Ensure
}

func (f *fakeSink) lastDSN() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dsn
}

func (f *fakeSink) called(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[name]++
}

func (f *fakeSink) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *fakeSink) Ensure(_ context.Context, t sinkdb.Target) (sinkdb.Ensured, error) {
	f.called("Ensure")
	f.mu.Lock()
	f.dsn = t.DSN
	f.mu.Unlock()
	return sinkdb.Ensured{Version: inbox.SchemaVersion, Identity: inbox.Identity{Owner: t.Claim.Owner, Epoch: "0123456789abcdef0123456789abcdef", Database: "1/test"}}, f.ensureErr
}

func (f *fakeSink) Drop(context.Context, sinkdb.Target) error { f.called("Drop"); return f.dropErr }

func (f *fakeSink) MarkRestored(context.Context, sinkdb.Target, string) error {
	f.called("MarkRestored")
	return nil
}

func (f *fakeSink) Release(owner string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released = append(f.released, owner)
}

func (f *fakeSink) CheckEffect(context.Context, sinkdb.Target, *config.Config) error {
	f.called("CheckEffect")
	return f.effectErr
}

func (f *fakeSink) AdoptWindow(_ context.Context, _ sinkdb.Target, derived retention.Result, now time.Time) (retention.Applied, bool, error) {
	f.called("AdoptWindow")
	f.mu.Lock()
	defer f.mu.Unlock()
	next, pending := retention.Adopt(f.stored, derived, now)
	f.stored = &next
	return next, pending, nil
}

func (f *fakeSink) StoredWindow(context.Context, sinkdb.Target) (*retention.Applied, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stored, nil
}

func (f *fakeSink) LastPrune(context.Context, sinkdb.Target) (*inbox.PruneRun, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return nil, f.lastPruneErr
}

func (f *fakeSink) OutboxStats(context.Context, sinkdb.Target) (inbox.OutboxStats, error) {
	return inbox.OutboxStats{}, nil
}

func (f *fakeSink) IDConflicts(context.Context, sinkdb.Target) (int64, error) { return 0, nil }

func (f *fakeSink) RedriveSummary(context.Context, sinkdb.Target, string) (inbox.RedriveSummary, error) {
	return inbox.RedriveSummary{}, nil
}

// fakeBroker answers every read with window (or err) and counts reads.
type fakeBroker struct {
	mu     sync.Mutex
	reads  int
	window time.Duration
	err    error
	limits retention.ConsumerLimits
	// lag the broker reports (7 when nil).
	lag *int64
	// consumerMissing: the broker has the stream but not the consumer yet
	// (no lag, the window still derived).
	consumerMissing bool
	// partitionLags are the partitions' backlogs the broker reports.
	partitionLags []int64
}

func (f *fakeBroker) Observe(_ context.Context, _ *config.Config, _ func(string) string, now time.Time) (BrokerReading, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.err != nil && !errors.Is(f.err, retention.ErrUnboundedReplay) {
		return BrokerReading{}, f.err
	}
	lag := int64(7)
	if f.lag != nil {
		lag = *f.lag
	}
	res := retention.Result{
		Window: f.window, Source: retention.SourceBroker, DerivedFrom: fmt.Sprintf("max_age=%s (fake)", f.window),
		InputsHash: fmt.Sprintf("%x", int64(f.window)), ObservedAt: now, Limits: f.limits,
	}
	if f.err != nil {
		// Unbounded replay: the horizons are filled in, the window is not.
		res.Window, res.DerivedFrom = 0, "max_age=0 (unlimited) (fake)"
	}
	if f.consumerMissing {
		return BrokerReading{Result: res, ConsumerMissing: true}, f.err
	}
	out := BrokerReading{Result: res, Lag: &lag}
	for _, l := range f.partitionLags {
		out.PartitionLags = append(out.PartitionLags, &l)
	}
	return out, f.err
}

func (f *fakeBroker) setConsumerMissing(missing bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.consumerMissing = missing
}

func (f *fakeBroker) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

// harness is a reconciler on fakes with one resource and its Secret.
type harness struct {
	t       *testing.T
	r       *Reconciler
	c       client.Client
	sink    *fakeSink
	broker  *fakeBroker
	clk     *testclock.FakeClock
	patches int
	applies int
	// secretGets counts full Secret reads (not the cached metadata).
	secretGets int
	mu         sync.Mutex
}

const fakePeriod = 5 * time.Minute

func unitConsumer() *messagingv1alpha1.IdempotentConsumer {
	return &messagingv1alpha1.IdempotentConsumer{
		ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: "shop", UID: "uid-orders", Generation: 1},
		Spec: messagingv1alpha1.IdempotentConsumerSpec{
			Source: messagingv1alpha1.SourceSpec{NATSJetStream: &messagingv1alpha1.NATSJetStreamSource{
				URL: "nats://127.0.0.1:4222", Stream: "ORDERS", Consumer: "orders",
			}},
			Message: messagingv1alpha1.MessageSpec{ID: messagingv1alpha1.IDSpec{Header: "Nats-Msg-Id"}},
			Sink: messagingv1alpha1.SinkSpec{
				Postgres: &messagingv1alpha1.PostgresSpec{ConnectionSecretRef: messagingv1alpha1.SecretKeyRef{Name: "db", Key: "dsn"}, Schema: "projections"},
				Inbox:    messagingv1alpha1.InboxSpec{Table: "inbox_orders"},
				Effect: messagingv1alpha1.EffectSpec{Upsert: &messagingv1alpha1.UpsertEffect{
					Table: "orders", Key: []messagingv1alpha1.SQLIdentifier{"order_id"},
					Columns: messagingv1alpha1.Columns{"order_id": "$.orderId", "status": "$.status"},
				}},
			},
			Retention: messagingv1alpha1.RetentionSpec{Prune: messagingv1alpha1.PruneSpec{Schedule: "*/15 * * * *", MaxDuration: "10m"}},
			Runtime:   messagingv1alpha1.RuntimeSpec{Replicas: ptr.To(int32(2))},
		},
	}
}

func newHarness(t *testing.T, objs ...client.Object) *harness {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := messagingv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, sink: &fakeSink{}, broker: &fakeBroker{window: 49 * time.Hour}, clk: testclock.NewFakeClock(time.Now())}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "shop"}, Data: map[string][]byte{"dsn": []byte("postgres://db/app")}}
	b := fake.NewClientBuilder().WithScheme(scheme).
		// The cluster's identity in the inbox's owner record.
		WithObjects(append([]client.Object{secret, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: "cluster-uid"}}}, objs...)...).
		WithStatusSubresource(&messagingv1alpha1.IdempotentConsumer{}).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if _, ok := obj.(*corev1.Secret); ok {
					h.mu.Lock()
					h.secretGets++
					h.mu.Unlock()
				}
				return c.Get(ctx, key, obj, opts...)
			},
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				h.mu.Lock()
				h.patches++
				h.mu.Unlock()
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
			Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
				h.mu.Lock()
				h.applies++
				h.mu.Unlock()
				return c.Apply(ctx, obj, opts...)
			},
		})
	for key, fn := range map[string]func(*messagingv1alpha1.IdempotentConsumer) []string{
		secretIndexKey:   secretNames,
		inboxIndexKey:    func(idc *messagingv1alpha1.IdempotentConsumer) []string { return []string{inboxIdentity(idc)} },
		consumerIndexKey: func(idc *messagingv1alpha1.IdempotentConsumer) []string { return []string{consumerIdentity(idc)} },
	} {
		b = b.WithIndex(&messagingv1alpha1.IdempotentConsumer{}, key, func(o client.Object) []string { return fn(o.(*messagingv1alpha1.IdempotentConsumer)) })
	}
	h.c = b.Build()
	h.r = &Reconciler{
		client: h.c, secrets: h.c, live: h.c, scheme: scheme, recorder: events.NewFakeRecorder(100),
		opts: Options{RuntimeImage: "idc-operator:test", RetentionPeriod: fakePeriod, MaxConcurrent: 1, Clock: h.clk,
			Sink: h.sink, Broker: h.broker, RecheckPeriod: DefaultRecheckPeriod, DropTimeout: time.Minute},
		memory: newMemory(),
	}
	return h
}

func (h *harness) counts() (patches, applies int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.patches, h.applies
}

// pass runs one Reconcile of shop/orders and returns the resource after it.
func (h *harness) pass() (*messagingv1alpha1.IdempotentConsumer, time.Duration) {
	h.t.Helper()
	res, err := h.r.Reconcile(context.Background(), reqFor("shop", "orders"))
	if err != nil {
		h.t.Fatalf("Reconcile: %v", err)
	}
	var idc messagingv1alpha1.IdempotentConsumer
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &idc); err != nil {
		h.t.Fatal(err)
	}
	return &idc, res.RequeueAfter
}

func conditionOf(idc *messagingv1alpha1.IdempotentConsumer, typ string) string {
	c := meta.FindStatusCondition(idc.Status.Conditions, typ)
	if c == nil {
		return ""
	}
	return string(c.Status) + "/" + c.Reason
}

// deploymentSecretsHash is the consumer pods' rollout hash of the Secrets.
func (h *harness) deploymentSecretsHash() string {
	h.t.Helper()
	var d appsv1.Deployment
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &d); err != nil {
		h.t.Fatal(err)
	}
	return d.Spec.Template.Annotations[specs.AnnotationSecretsHash]
}

// markAvailable plays the Deployment controller.
func (h *harness) markAvailable() {
	h.t.Helper()
	var d appsv1.Deployment
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &d); err != nil {
		h.t.Fatal(err)
	}
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 2, ReadyReplicas: 2, AvailableReplicas: 2, UpdatedReplicas: 2,
		Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}}}
	if err := h.c.Status().Update(context.Background(), &d); err != nil {
		h.t.Fatal(err)
	}
}

func reqFor(namespace, name string) ctrl.Request {
	return ctrl.Request{NamespacedName: types.NamespacedName{Namespace: namespace, Name: name}}
}
