package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
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
	return BrokerReading{Result: res, Lag: &lag}, f.err
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
				Postgres: messagingv1alpha1.PostgresSpec{ConnectionSecretRef: messagingv1alpha1.SecretKeyRef{Name: "db", Key: "dsn"}, Schema: "projections"},
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

// Once Ready, a pass over an unchanged world writes nothing: no status
// patch, no apply, no broker read until --retention-period has passed; and
// then one read that finds nothing new still writes nothing.
func TestSteadyStateWritesNothing(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.pass()
	if _, applies := h.counts(); applies != 4 {
		t.Errorf("%d applies to bring up the children, want 4 (ConfigMap, Deployment, CronJob, PodDisruptionBudget, once each)", applies)
	}
	h.markAvailable()
	// The fake client keeps no generation, so the Deployment's status
	// write looks like a change to it here (a real API server's does not).
	idc, _ := h.pass()
	if got := conditionOf(idc, messagingv1alpha1.ConditionReady); got != "True/Ready" {
		t.Fatalf("Ready = %s, want True/Ready (%s)", got, meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionReady).Message)
	}
	patches, applies := h.counts()
	reads := h.broker.readCount()
	observedAt := idc.Status.Retention.ObservedAt

	for range 5 {
		h.clk.Step(time.Minute / 2)
		h.pass()
	}
	if p, a := h.counts(); p != patches || a != applies {
		t.Errorf("steady passes wrote %d status patches and %d applies, want none", p-patches, a-applies)
	}
	if got := h.broker.readCount(); got != reads {
		t.Errorf("the broker was read %d times within --retention-period, want 0", got-reads)
	}

	h.clk.Step(fakePeriod)
	idc, requeue := h.pass()
	if got := h.broker.readCount(); got != reads+1 {
		t.Errorf("after --retention-period the broker was read %d times, want once", got-reads)
	}
	if p, a := h.counts(); p != patches || a != applies {
		t.Errorf("a broker read that found nothing new wrote %d status patches and %d applies, want none", p-patches, a-applies)
	}
	if !idc.Status.Retention.ObservedAt.Equal(observedAt) {
		t.Errorf("observedAt moved from %v to %v with unchanged inputs", observedAt, idc.Status.Retention.ObservedAt)
	}
	if requeue <= 0 || requeue > fakePeriod+fakePeriod/10 {
		t.Errorf("requeue after %s, want within --retention-period (+10%% jitter)", requeue)
	}

	// A spec change is read at once.
	idc.Spec.Source.NATSJetStream.URL = "nats://127.0.0.1:4223"
	idc.Generation++
	if err := h.c.Update(context.Background(), idc); err != nil {
		t.Fatal(err)
	}
	h.pass()
	if got := h.broker.readCount(); got != reads+2 {
		t.Errorf("a source change was read %d times, want once", got-reads-1)
	}
}

// A new resource's first pass posts one Normal event for the conditions it
// turned True (not one each); later transitions have their own events.
func TestFirstPassPostsOneEvent(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.pass()
	rec := h.r.recorder.(*events.FakeRecorder)
	drain := func() []string {
		var seen []string
		for len(rec.Events) > 0 {
			seen = append(seen, <-rec.Events)
		}
		return seen
	}
	seen := drain()
	if len(seen) != 1 || !containsWith(seen, "Normal Provisioned", "InboxReady: inbox projections.inbox_orders", "; EffectReady: ", "; PruneScheduled: ") {
		t.Fatalf("first pass events %q, want one Normal Provisioned naming InboxReady, EffectReady and PruneScheduled", seen)
	}
	h.markAvailable()
	h.pass()
	if seen := drain(); len(seen) != 1 || !containsWith(seen, "Normal RuntimeDeployed") {
		t.Fatalf("events when the Deployment became available %q, want one Normal RuntimeDeployed", seen)
	}
	long := strings.Repeat("é", maxNote)
	if got := truncateNote(long); len(got) > maxNote || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("truncateNote kept %d bytes (valid UTF-8 %v), want at most %d ending in an ellipsis", len(got), utf8.ValidString(got), maxNote)
	}
}

// A Secret is read in full once per version: passes while it is unchanged
// take its data from the memo, a rotation is read at the next pass and
// rolls the pods, and a Secret deleted is reported at once.
func TestSecretIsReadOncePerVersion(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.pass()
	h.markAvailable()
	h.pass()
	for range 3 {
		h.clk.Step(fakePeriod)
		h.pass()
	}
	h.mu.Lock()
	gets := h.secretGets
	h.mu.Unlock()
	if gets != 1 {
		t.Errorf("%d Secret GETs in 5 passes with the Secret unchanged, want 1", gets)
	}
	before := h.deploymentSecretsHash()

	ctx := context.Background()
	var sec corev1.Secret
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "db"}, &sec); err != nil {
		t.Fatal(err)
	}
	sec.Data["dsn"] = []byte("postgres://db/rotated")
	if err := h.c.Update(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	gets = h.secretGets // with the test's own read
	h.mu.Unlock()
	h.pass()
	h.mu.Lock()
	gets = h.secretGets - gets
	h.mu.Unlock()
	if gets != 1 {
		t.Errorf("%d Secret GETs in the pass after a rotation, want 1", gets)
	}
	if got := h.sink.lastDSN(); got != "postgres://db/rotated" {
		t.Errorf("the sink was reached with %q after the rotation, want the new value", got)
	}
	if after := h.deploymentSecretsHash(); after == before {
		t.Errorf("the pods' secrets hash stayed %q after a rotation", after)
	}

	if err := h.c.Delete(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Reconcile(ctx, reqFor("shop", "orders")); err == nil {
		t.Fatal("a pass with the Secret deleted succeeded")
	}
	idc := &messagingv1alpha1.IdempotentConsumer{}
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "orders"}, idc); err != nil {
		t.Fatal(err)
	}
	if got := conditionOf(idc, messagingv1alpha1.ConditionReady); got != "False/"+messagingv1alpha1.ReasonSecretNotFound {
		t.Errorf("with the Secret deleted, Ready = %s, want False/%s", got, messagingv1alpha1.ReasonSecretNotFound)
	}
}

// An unbounded replay stalls, and reading the same unbounded broker again
// writes nothing.
func TestUnboundedReplayReadAgainWritesNothing(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.broker.err = fmt.Errorf("%w: stream ORDERS max_age=0", retention.ErrUnboundedReplay)
	idc, _ := h.pass()
	if got := conditionOf(idc, messagingv1alpha1.ConditionStalled); got != "True/UnboundedReplay" {
		t.Fatalf("Stalled = %s, want True/UnboundedReplay", got)
	}
	patches, _ := h.counts()
	h.clk.Step(fakePeriod)
	h.pass()
	if h.broker.readCount() != 2 {
		t.Fatalf("%d reads, want 2", h.broker.readCount())
	}
	if p, _ := h.counts(); p != patches {
		t.Fatalf("a second read of the same unbounded broker wrote %d status patches, want none", p-patches)
	}
}

// A Deployment edited behind the operator's back is applied again.
func TestDriftedChildIsAppliedAgain(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.pass()
	var d appsv1.Deployment
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &d); err != nil {
		t.Fatal(err)
	}
	d.Spec.Replicas = ptr.To(int32(9))
	d.Generation++
	if err := h.c.Update(context.Background(), &d); err != nil {
		t.Fatal(err)
	}
	_, before := h.counts()
	h.pass()
	if _, after := h.counts(); after != before+1 {
		t.Fatalf("%d applies after the Deployment drifted, want 1", after-before)
	}
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &d); err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 2 {
		t.Fatalf("replicas %d after the re-apply, want 2", *d.Spec.Replicas)
	}
}

// BrokerLimits is Unknown, with the reason, while the broker cannot be
// read: a limit that was not read is not a limit that fits.
func TestBrokerLimitsUnknownWhileTheBrokerIsNotRead(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.broker.err = fmt.Errorf("%w: while dialing nats://127.0.0.1:4222: connection refused", retention.ErrBrokerUnreachable)
	idc, requeue := h.pass()
	if got := conditionOf(idc, messagingv1alpha1.ConditionBrokerLimits); got != "Unknown/BrokerUnreachable" {
		t.Fatalf("BrokerLimits = %s, want Unknown/BrokerUnreachable", got)
	}
	if requeue > DefaultRecheckPeriod {
		t.Errorf("a failed read is retried after %s, want within %s", requeue, DefaultRecheckPeriod)
	}
	// Read again after the re-check period, not after --retention-period.
	h.clk.Step(DefaultRecheckPeriod)
	h.broker.err = nil
	h.broker.limits = retention.ConsumerLimits{MaxAckPending: 100000}
	idc, _ = h.pass()
	if got := conditionOf(idc, messagingv1alpha1.ConditionBrokerLimits); got != "True/LimitsFit" {
		t.Fatalf("BrokerLimits = %s once the broker answers, want True/LimitsFit", got)
	}
	if h.broker.readCount() != 2 {
		t.Fatalf("%d reads, want 2", h.broker.readCount())
	}
}

// A child of the same name that someone else owns stalls the pass with
// Conflict, and nothing after it runs: no redrive Job is created.
func TestChildConflictStopsThePass(t *testing.T) {
	idc := unitConsumer()
	idc.Annotations = map[string]string{messagingv1alpha1.AnnotationRedrive: "t-1"}
	squatter := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "orders-runtime", Namespace: "shop"}}
	h := newHarness(t, idc, squatter)
	got, _ := h.pass()
	if c := conditionOf(got, messagingv1alpha1.ConditionStalled); c != "True/Conflict" {
		t.Fatalf("Stalled = %s, want True/Conflict", c)
	}
	var jobs batchv1.JobList
	if err := h.c.List(context.Background(), &jobs, client.InNamespace("shop")); err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) != 0 {
		t.Fatalf("%d Jobs created after a conflict, want none", len(jobs.Items))
	}
	if _, applies := h.counts(); applies != 0 {
		t.Fatalf("%d applies after a conflict on the first child, want none", applies)
	}
}

// While EffectReady is False the pass asks to run again within the
// re-check period (20s by default); once True, only the periodic requeue.
func TestEffectRecheckWithin30s(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.sink.effectErr = &sinkdb.EffectProblem{Reason: messagingv1alpha1.ReasonTableNotFound, Message: "missing"}
	for range 50 {
		idc, requeue := h.pass()
		if requeue <= 0 || requeue > DefaultRecheckPeriod {
			t.Fatalf("re-check after %s while EffectReady is False, want (0, %s]", requeue, DefaultRecheckPeriod)
		}
		if got := conditionOf(idc, messagingv1alpha1.ConditionEffectReady); got != "False/TableNotFound" {
			t.Fatalf("EffectReady = %s", got)
		}
	}
	var d appsv1.Deployment
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &d); err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 0 {
		t.Fatalf("replicas %d while EffectReady is False, want 0", *d.Spec.Replicas)
	}
	h.sink.effectErr = nil
	if _, requeue := h.pass(); requeue < fakePeriod/2 {
		t.Fatalf("re-check after %s once EffectReady is True, want the periodic one", requeue)
	}
}

// A spec that does not render stalls before anything is created, and gets
// no finalizer: deleting it can never wait on tables it never had.
func TestInvalidSpecStallsBeforeTheFinalizer(t *testing.T) {
	idc := unitConsumer()
	idc.Spec.Sink.Inbox.DeletionPolicy = messagingv1alpha1.DeletionPolicyDelete
	idc.Spec.Sink.Effect = messagingv1alpha1.EffectSpec{SQL: &messagingv1alpha1.SQLEffect{Statement: "UPDATE t SET n = :n", Params: map[string]messagingv1alpha1.ValueExpression{}}}
	h := newHarness(t, idc)
	got, _ := h.pass()
	if c := conditionOf(got, messagingv1alpha1.ConditionStalled); c != "True/InvalidSpec" {
		t.Fatalf("Stalled = %s, want True/InvalidSpec", c)
	}
	if len(got.Finalizers) != 0 {
		t.Fatalf("finalizers %v on a resource that never rendered", got.Finalizers)
	}
	if n := h.sink.count("Ensure"); n != 0 {
		t.Fatalf("the inbox was provisioned %d times for a spec that does not render", n)
	}
}

// A deletion whose spec no longer renders completes at once, leaves the
// tables in place and says so in a Warning event.
func TestDeletionOfASpecThatNoLongerRenders(t *testing.T) {
	idc := unitConsumer()
	idc.Spec.Sink.Inbox.DeletionPolicy = messagingv1alpha1.DeletionPolicyDelete
	h := newHarness(t, idc)
	got, _ := h.pass()
	if len(got.Finalizers) != 1 {
		t.Fatalf("finalizers %v, want the drop-inbox one", got.Finalizers)
	}
	// An id rule the runtime config refuses (a stricter release, say).
	got.Spec.Message.ID = messagingv1alpha1.IDSpec{}
	if err := h.c.Update(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Delete(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Reconcile(context.Background(), reqFor("shop", "orders")); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, got); err == nil {
		t.Fatalf("the resource is still there, finalizers %v", got.Finalizers)
	}
	if n := h.sink.count("Drop"); n != 0 {
		t.Fatalf("Drop called %d times for a spec that does not render", n)
	}
	rec := h.r.recorder.(*events.FakeRecorder)
	var seen []string
	for len(rec.Events) > 0 {
		seen = append(seen, <-rec.Events)
	}
	if !containsWith(seen, "Warning "+messagingv1alpha1.ReasonInboxRetained, "projections.inbox_orders", "no longer renders") {
		t.Fatalf("no InboxRetained Warning naming the table among %q", seen)
	}
	if len(h.sink.released) == 0 || h.sink.released[len(h.sink.released)-1] != "shop/orders" {
		t.Fatalf("the pool of the deleted resource was not released: %v", h.sink.released)
	}
}

// A sink database that stays unreachable holds a deletion for
// --drop-timeout at most, then the tables are left in place.
func TestDeletionGivesUpOnAnUnreachableDatabase(t *testing.T) {
	idc := unitConsumer()
	idc.Spec.Sink.Inbox.DeletionPolicy = messagingv1alpha1.DeletionPolicyDelete
	h := newHarness(t, idc)
	got, _ := h.pass()
	h.sink.dropErr = errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	if err := h.c.Delete(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	res, err := h.r.Reconcile(context.Background(), reqFor("shop", "orders"))
	if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > dropRetry {
		t.Fatalf("first try: %v, requeue %s; want a retry within %s", err, res.RequeueAfter, dropRetry)
	}
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, got); err != nil {
		t.Fatalf("the resource went before the drop timed out: %v", err)
	}
	h.clk.Step(h.r.opts.DropTimeout + time.Second)
	if _, err := h.r.Reconcile(context.Background(), reqFor("shop", "orders")); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, got); err == nil {
		t.Fatal("the resource is still there after --drop-timeout")
	}
}

func containsWith(events []string, subs ...string) bool {
	for _, e := range events {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(e, s)
		}
		if all {
			return true
		}
	}
	return false
}

func TestValidateSQLParams(t *testing.T) {
	for _, tc := range []struct {
		stmt   string
		params map[string]string
		want   string
	}{
		{"UPDATE a SET n = :n WHERE id = :id", map[string]string{"n": "$.n", "id": "$.id"}, ""},
		{"UPDATE a SET n = :n WHERE id = :id", map[string]string{"n": "$.n"}, ":id"},
		{"UPDATE a SET n = 1 WHERE id = :id", map[string]string{"id": "$.id", "extra": "$.x"}, "params.extra"},
	} {
		cfg := &config.Config{Sink: config.Sink{Effect: config.Effect{SQL: &config.SQL{Statement: tc.stmt, Params: tc.params}}}}
		err := validateSQLParams(cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q %v: %v", tc.stmt, tc.params, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q %v: error %v, want one naming %s", tc.stmt, tc.params, err, tc.want)
		}
	}
}

func reqFor(namespace, name string) ctrl.Request {
	return ctrl.Request{NamespacedName: types.NamespacedName{Namespace: namespace, Name: name}}
}

// Every sink fault is re-checked within the re-check period and never
// fails the pass (so controller-runtime's backoff never grows); the faults
// only a person can fix set Stalled=True (kstatus Failed, Argo CD
// Degraded) with the condition's message, the transient ones leave the
// resource Reconciling. Recovery clears Stalled.
func TestSinkFaultsAreRecheckedAndStallOnlyForAPerson(t *testing.T) {
	unreachable := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	tests := []struct {
		name              string
		ensureErr         error
		effectErr         error
		condition, reason string
		stalled           bool
	}{
		{"inbox permission denied", &pgconn.PgError{Code: "42501", Message: "permission denied for schema projections"}, nil,
			messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ReasonPermissionDenied, true},
		{"inbox database unreachable", unreachable, nil,
			messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ReasonDatabaseError, false},
		{"inbox provisioning failed", &pgconn.PgError{Code: "53100", Message: "could not extend file"}, nil,
			messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ReasonProvisioningFailed, false},
		{"inbox connection string", fmt.Errorf("while parsing: %w", sinkdb.ErrInvalidDSN), nil,
			messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ReasonInvalidDSN, true},
		{"inbox migration queued", fmt.Errorf("%w: waited 20s", sinkdb.ErrMigrationQueued), nil,
			messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ReasonMigrationQueued, false},
		{"effect database unreachable", nil, unreachable,
			messagingv1alpha1.ConditionEffectReady, messagingv1alpha1.ReasonDatabaseError, false},
	}
	for _, reason := range []string{messagingv1alpha1.ReasonPermissionDenied, messagingv1alpha1.ReasonTableNotFound,
		messagingv1alpha1.ReasonColumnNotFound, messagingv1alpha1.ReasonColumnTypeMismatch, messagingv1alpha1.ReasonNoUniqueKey,
		messagingv1alpha1.ReasonStatementInvalid} {
		tests = append(tests, struct {
			name              string
			ensureErr         error
			effectErr         error
			condition, reason string
			stalled           bool
		}{"effect " + reason, nil, &sinkdb.EffectProblem{Reason: reason, Message: "run this"}, messagingv1alpha1.ConditionEffectReady, reason, true})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, unitConsumer())
			h.sink.ensureErr, h.sink.effectErr = tc.ensureErr, tc.effectErr
			for range 10 {
				res, err := h.r.Reconcile(context.Background(), reqFor("shop", "orders"))
				if err != nil {
					t.Fatalf("Reconcile failed (growing backoff) instead of asking for a re-check: %v", err)
				}
				if res.RequeueAfter <= 0 || res.RequeueAfter > DefaultRecheckPeriod {
					t.Fatalf("re-check after %s, want (0, %s]", res.RequeueAfter, DefaultRecheckPeriod)
				}
			}
			idc, _ := h.pass()
			if got := conditionOf(idc, tc.condition); got != "False/"+tc.reason {
				t.Fatalf("%s = %s, want False/%s", tc.condition, got, tc.reason)
			}
			wantStalled, wantReconciling := "False/Ready", "True/"+tc.reason
			if tc.stalled {
				wantStalled, wantReconciling = "True/"+tc.reason, "False/Ready"
				if msg := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionStalled).Message; msg == "" || msg == "no human action needed" {
					t.Errorf("Stalled message %q does not say what to do", msg)
				}
			}
			if got := conditionOf(idc, messagingv1alpha1.ConditionStalled); got != wantStalled {
				t.Errorf("Stalled = %s, want %s", got, wantStalled)
			}
			if got := conditionOf(idc, messagingv1alpha1.ConditionReconciling); got != wantReconciling {
				t.Errorf("Reconciling = %s, want %s", got, wantReconciling)
			}
			// kstatus reads Stalled only for an observed generation.
			if idc.Status.ObservedGeneration != idc.Generation {
				t.Errorf("observedGeneration %d, want %d", idc.Status.ObservedGeneration, idc.Generation)
			}
			h.sink.ensureErr, h.sink.effectErr = nil, nil
			h.pass()
			h.markAvailable()
			idc, _ = h.pass()
			for typ, want := range map[string]string{messagingv1alpha1.ConditionStalled: "False/Ready", messagingv1alpha1.ConditionReady: "True/Ready", tc.condition: "True/"} {
				if got := conditionOf(idc, typ); !strings.HasPrefix(got, want) {
					t.Errorf("after the fix %s = %s, want %s", typ, got, want)
				}
			}
		})
	}
}

// Stalled names the first thing a person must fix, in phase order: a sink
// that cannot take the effect before a broker that replays without bound.
func TestStalledNamesTheFirstFaultInPhaseOrder(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.sink.effectErr = &sinkdb.EffectProblem{Reason: messagingv1alpha1.ReasonNoUniqueKey, Message: "run CREATE UNIQUE INDEX"}
	h.broker.err = retention.ErrUnboundedReplay
	idc, _ := h.pass()
	for typ, want := range map[string]string{
		messagingv1alpha1.ConditionStalled:           "True/NoUniqueKey",
		messagingv1alpha1.ConditionRetentionResolved: "False/UnboundedReplay",
	} {
		if got := conditionOf(idc, typ); got != want {
			t.Errorf("%s = %s, want %s", typ, got, want)
		}
	}
	h.sink.effectErr = nil
	h.clk.Step(fakePeriod)
	idc, _ = h.pass()
	if got := conditionOf(idc, messagingv1alpha1.ConditionStalled); got != "True/UnboundedReplay" {
		t.Errorf("once the sink is fixed Stalled = %s, want True/UnboundedReplay", got)
	}
}

// A pass a child's change wakes after a complete sink check (the
// Deployment turning available after the first pass) reuses that check: no
// statement of the checks reaches the sink database, and status is what a
// fresh check would write. After --recheck-period (so a DROP or REVOKE
// behind the controller's back is seen by the next pass), on a new
// generation or after a check that failed, the sink is checked again.
func TestSinkChecksAreReusedUntilThePeriodicPass(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.pass()
	sinkCalls := func() [3]int {
		return [3]int{h.sink.count("Ensure"), h.sink.count("CheckEffect"), h.sink.count("AdoptWindow")}
	}
	first := sinkCalls()
	if first != [3]int{1, 1, 1} {
		t.Fatalf("first pass: Ensure, CheckEffect, AdoptWindow called %v times, want once each", first)
	}
	h.markAvailable()
	h.clk.Step(DefaultRecheckPeriod / 2)
	idc, _ := h.pass()
	if got := sinkCalls(); got != first {
		t.Errorf("a pass %s after a complete check called the sink %v times in all, want %v (no new call)", DefaultRecheckPeriod/2, got, first)
	}
	if got := conditionOf(idc, messagingv1alpha1.ConditionReady); got != "True/Ready" {
		t.Fatalf("Ready = %s after a reused check, want True/Ready", got)
	}
	for _, c := range []string{messagingv1alpha1.ConditionInboxReady, messagingv1alpha1.ConditionEffectReady, messagingv1alpha1.ConditionRetentionResolved} {
		if got := meta.FindStatusCondition(idc.Status.Conditions, c); got == nil || got.Status != metav1.ConditionTrue {
			t.Errorf("%s = %v after a reused check, want True", c, got)
		}
	}
	if idc.Status.Inbox == nil || idc.Status.Retention == nil || idc.Status.Retention.Window == "" {
		t.Errorf("status.inbox %v, status.retention %v after a reused check, want both kept", idc.Status.Inbox, idc.Status.Retention)
	}

	// --recheck-period has passed since the check: the next pass checks.
	h.clk.Step(DefaultRecheckPeriod)
	h.pass()
	if got := sinkCalls(); got[0] != 2 || got[1] != 2 {
		t.Errorf("the pass after --recheck-period: the sink called %v times in all, want Ensure and CheckEffect twice", got)
	}

	// A new generation is checked at once, and a failed check is never
	// reused: each pass checks again.
	h.sink.effectErr = &sinkdb.EffectProblem{Reason: messagingv1alpha1.ReasonColumnNotFound, Message: "missing"}
	var cur messagingv1alpha1.IdempotentConsumer
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Generation++
	if err := h.c.Update(context.Background(), &cur); err != nil {
		t.Fatal(err)
	}
	h.pass()
	h.pass()
	if got := sinkCalls(); got[1] != 4 {
		t.Errorf("two passes of a new generation whose effect check fails called CheckEffect %d times in all, want 4", got[1])
	}
}

// A kept sink check is never reused past the periodic pass, even when it was
// taken after the broker reading in force (the first good pass after a
// failing one); nor while the consumer Deployment is not available; nor
// after a read of the runtime's records failed.
func TestSinkChecksAreNotReusedWhenInDoubt(t *testing.T) {
	t.Run("aged from the broker reading", func(t *testing.T) {
		h := newHarness(t, unitConsumer())
		h.sink.effectErr = &sinkdb.EffectProblem{Reason: messagingv1alpha1.ReasonColumnNotFound, Message: "missing"}
		h.pass() // reads the broker at T0; the check fails
		h.sink.effectErr = nil
		h.clk.Step(DefaultRecheckPeriod)
		h.pass() // the check passes at T0+20s, with the reading of T0
		h.markAvailable()
		ensures := h.sink.count("Ensure")
		h.clk.Step(fakePeriod - DefaultRecheckPeriod + time.Second)
		h.pass() // T0 + period + 1s: the periodic pass
		if got := h.sink.count("Ensure"); got != ensures+1 {
			t.Errorf("the periodic pass after the reading of the kept check called Ensure %d times, want once", got-ensures)
		}
	})
	t.Run("Deployment not available", func(t *testing.T) {
		h := newHarness(t, unitConsumer())
		h.pass()
		h.pass()
		if got := h.sink.count("Ensure"); got != 2 {
			t.Errorf("two passes while the Deployment is not available called Ensure %d times, want 2", got)
		}
	})
	t.Run("records unreadable", func(t *testing.T) {
		h := newHarness(t, unitConsumer())
		h.pass()
		h.markAvailable()
		h.sink.mu.Lock()
		h.sink.lastPruneErr = errors.New("connection refused")
		h.sink.mu.Unlock()
		h.pass() // reuses the check; the last prune run cannot be read
		h.pass()
		if got := h.sink.count("Ensure"); got != 2 {
			t.Errorf("after the last prune run could not be read, Ensure was called %d times in all, want 2 (checked again)", got)
		}
	})
}
