package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// kedaEnv is a real kube-apiserver with this repository's CRDs and KEDA's
// own (from the KEDA module in the Go module cache), and a reconciler that
// talks to it directly (fake sink and broker: the KEDA objects are the
// subject here).
type kedaEnv struct {
	t *testing.T
	c client.Client
	r *Reconciler
}

func newKEDAEnv(t *testing.T) *kedaEnv {
	t.Helper()
	kedaCRDs, err := testenv.KEDACRDs()
	if err != nil {
		t.Fatal(err)
	}
	assets, err := testenv.Assets()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ErrorIfCRDPathMissing: true,
		CRDDirectoryPaths: []string{filepath.Join(testenv.RepoRoot(), "config", "crd", "bases"), kedaCRDs}}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := messagingv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}); err != nil {
		t.Fatal(err)
	}
	clk := testclock.NewFakeClock(time.Now())
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The manager's cache with the reconciler's field indexes (the conflict
	// phase lists by them); no controller: the test runs the passes.
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, Cache: CacheOptions(nil)})
	if err != nil {
		t.Fatal(err)
	}
	for key, fn := range map[string]func(*messagingv1alpha1.IdempotentConsumer) []string{
		secretIndexKey:   secretNames,
		inboxIndexKey:    func(idc *messagingv1alpha1.IdempotentConsumer) []string { return []string{inboxIdentity(idc)} },
		consumerIndexKey: func(idc *messagingv1alpha1.IdempotentConsumer) []string { return []string{consumerIdentity(idc)} },
	} {
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), &messagingv1alpha1.IdempotentConsumer{}, key, func(o client.Object) []string {
			return fn(o.(*messagingv1alpha1.IdempotentConsumer))
		}); err != nil {
			t.Fatal(err)
		}
	}
	mctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = mgr.Start(mctx) }()
	if !mgr.GetCache().WaitForCacheSync(mctx) {
		t.Fatal("the cache did not sync")
	}
	r := &Reconciler{
		client: mgr.GetClient(), secrets: c, live: c, scheme: scheme, recorder: events.NewFakeRecorder(100),
		opts: Options{RuntimeImage: "idc-operator:test", RetentionPeriod: fakePeriod, MaxConcurrent: 1, Clock: clk,
			Sink: &fakeSink{}, Broker: &fakeBroker{window: 49 * time.Hour}, RecheckPeriod: DefaultRecheckPeriod, DropTimeout: time.Minute,
			KEDA: NewDiscoveryKEDA(disc, clk, time.Minute)},
		memory: newMemory(),
	}
	return &kedaEnv{t: t, c: c, r: r}
}

func (e *kedaEnv) create(objs ...client.Object) {
	e.t.Helper()
	for _, o := range objs {
		if err := e.c.Create(context.Background(), o); err != nil {
			e.t.Fatalf("creating %s: %v", o.GetName(), err)
		}
	}
}

// pass runs passes until the cache has seen the resource at its current
// generation and a pass has observed it.
func (e *kedaEnv) pass(name string) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := e.r.Reconcile(context.Background(), reqFor("shop", name)); err != nil {
			e.t.Fatalf("Reconcile %s: %v", name, err)
		}
		idc := getIDC(e.t, e.c, name)
		if idc.Status.ObservedGeneration == idc.Generation {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: no pass observed generation %d (status %+v)", name, idc.Generation, idc.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *kedaEnv) read(gvkKind string, name string) *unstructured.Unstructured {
	e.t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(specs.GVKScaledObject.GroupVersion().WithKind(gvkKind))
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: name}, u); err != nil {
		e.t.Fatalf("reading %s %s: %v", gvkKind, name, err)
	}
	return u
}

func secretOf(name string, keys ...string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"}, StringData: map[string]string{}}
	for _, k := range keys {
		s.StringData[k] = "x-" + k
	}
	return s
}

// autoscaledConsumer is unitConsumer named name, with source src and
// autoscaling 1..5 at 800 per replica, as a user would write it (the API
// server defaults the rest).
func autoscaledConsumer(name string, src messagingv1alpha1.SourceSpec) *messagingv1alpha1.IdempotentConsumer {
	idc := unitConsumer()
	idc.ObjectMeta = metav1.ObjectMeta{Name: name, Namespace: "shop"}
	idc.Spec.Source = src
	idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier("inbox_" + name)
	idc.Spec.Runtime.Replicas = nil
	idc.Spec.Runtime.Autoscaling = &messagingv1alpha1.AutoscalingSpec{MaxReplicas: 5, LagPerReplica: ptr.To(int64(800)), ActivationLag: 3,
		PollingInterval: "5s", CooldownPeriod: "30s", ScaleDownStabilization: "20s", NATSAccount: "$G"}
	return idc
}

// The rendered ScaledObject and TriggerAuthentication, per source kind, as
// a real API server with KEDA's own CRDs stores them (a field KEDA's schema
// does not know would be pruned, a wrong type refused): read back and
// compared field by field.
func TestKEDAObjectsPerSourceKindAgainstKEDAsCRDs(t *testing.T) {
	e := newKEDAEnv(t)
	e.create(secretOf("db", "dsn"), secretOf("kafka", "user", "password", "ca"), secretOf("rabbit", "uri"), secretOf("redis", "password"))
	ref := func(name, key string) messagingv1alpha1.SecretKeyRef {
		return messagingv1alpha1.SecretKeyRef{Name: name, Key: key}
	}
	cases := []struct {
		name     string
		src      messagingv1alpha1.SourceSpec
		typ      string
		metadata map[string]any
		auth     []any // secretTargetRef; nil: no TriggerAuthentication
	}{{
		name: "nats",
		src:  messagingv1alpha1.SourceSpec{NATSJetStream: &messagingv1alpha1.NATSJetStreamSource{URL: "nats://nats.messaging:4222", Stream: "ORDERS", Consumer: "nats"}},
		typ:  "nats-jetstream",
		metadata: map[string]any{"natsServerMonitoringEndpoint": "nats.messaging:8222", "useHttps": "false", "account": "$G",
			"stream": "ORDERS", "consumer": "nats", "lagThreshold": "800", "activationLagThreshold": "3"},
	}, {
		name: "kafka",
		src: messagingv1alpha1.SourceSpec{Kafka: &messagingv1alpha1.KafkaSource{BootstrapServers: []string{"k1:9093", "k2:9093"}, Topics: []string{"orders"}, ConsumerGroup: "projector",
			SASL: &messagingv1alpha1.KafkaSASL{Mechanism: "SCRAM-SHA-512", UsernameSecretRef: ref("kafka", "user"), PasswordSecretRef: ref("kafka", "password")},
			TLS:  &messagingv1alpha1.TLSSpec{CASecretRef: ptr.To(ref("kafka", "ca"))}}},
		typ: "kafka",
		metadata: map[string]any{"bootstrapServers": "k1:9093,k2:9093", "consumerGroup": "projector", "topic": "orders", "offsetResetPolicy": "earliest",
			"lagThreshold": "800", "activationLagThreshold": "3", "sasl": "scram_sha512", "tls": "enable"},
		auth: []any{
			map[string]any{"parameter": "username", "name": "kafka", "key": "user"},
			map[string]any{"parameter": "password", "name": "kafka", "key": "password"},
			map[string]any{"parameter": "ca", "name": "kafka", "key": "ca"},
		},
	}, {
		name:     "rabbit",
		src:      messagingv1alpha1.SourceSpec{RabbitMQ: &messagingv1alpha1.RabbitMQSource{URISecretRef: ref("rabbit", "uri"), Queue: "orders"}},
		typ:      "rabbitmq",
		metadata: map[string]any{"protocol": "amqp", "queueName": "orders", "mode": "QueueLength", "value": "800", "activationValue": "3"},
		auth:     []any{map[string]any{"parameter": "host", "name": "rabbit", "key": "uri"}},
	}, {
		name: "redis",
		src: messagingv1alpha1.SourceSpec{RedisStreams: &messagingv1alpha1.RedisStreamsSource{Address: "redis.messaging:6379", PasswordSecretRef: ptr.To(ref("redis", "password")),
			Stream: "orders", Group: "projector"}},
		typ:      "redis-streams",
		metadata: map[string]any{"address": "redis.messaging:6379", "stream": "orders", "consumerGroup": "projector", "lagCount": "800", "activationLagCount": "3"},
		auth:     []any{map[string]any{"parameter": "password", "name": "redis", "key": "password"}},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			e.create(autoscaledConsumer(c.name, c.src))
			e.pass(c.name)
			so := e.read("ScaledObject", c.name)
			want := map[string]any{
				"scaleTargetRef":  map[string]any{"apiVersion": "apps/v1", "kind": "Deployment", "name": c.name},
				"minReplicaCount": int64(1), "maxReplicaCount": int64(5), "pollingInterval": int64(5), "cooldownPeriod": int64(30),
				"advanced": map[string]any{"horizontalPodAutoscalerConfig": map[string]any{"behavior": map[string]any{
					"scaleDown": map[string]any{"stabilizationWindowSeconds": int64(20)}}}},
			}
			trigger := map[string]any{"type": c.typ, "metadata": c.metadata}
			if c.auth != nil {
				trigger["authenticationRef"] = map[string]any{"name": c.name + "-keda"}
			}
			want["triggers"] = []any{trigger}
			spec, _, _ := unstructured.NestedMap(so.Object, "spec")
			for k, v := range want {
				if !reflect.DeepEqual(spec[k], v) {
					t.Errorf("spec.%s = %#v,\n want %#v", k, spec[k], v)
				}
			}
			if !metav1.IsControlledBy(so, getIDC(t, e.c, c.name)) {
				t.Errorf("the ScaledObject is not controlled by the resource: %v", so.GetOwnerReferences())
			}
			if c.auth == nil {
				ta := &unstructured.Unstructured{}
				ta.SetGroupVersionKind(specs.GVKTriggerAuthentication)
				if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: c.name + "-keda"}, ta); err == nil {
					t.Errorf("a TriggerAuthentication exists for a scaler that needs no Secret")
				}
				return
			}
			ta := e.read("TriggerAuthentication", c.name+"-keda")
			refs, _, _ := unstructured.NestedSlice(ta.Object, "spec", "secretTargetRef")
			if !reflect.DeepEqual(refs, c.auth) {
				t.Errorf("secretTargetRef = %#v,\n want %#v (the source's own Secrets, no value copied)", refs, c.auth)
			}
			if env, ok, _ := unstructured.NestedSlice(ta.Object, "spec", "env"); ok {
				t.Errorf("the TriggerAuthentication carries env %v", env)
			}
			st := getIDC(t, e.c, c.name).Status
			if st.Runtime == nil || st.Runtime.ScaledObject != c.name {
				t.Errorf("status.runtime %+v: want scaledObject %s", st.Runtime, c.name)
			}
		})
	}
}

func getIDC(t *testing.T, c client.Client, name string) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	var idc messagingv1alpha1.IdempotentConsumer
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: name}, &idc); err != nil {
		t.Fatal(err)
	}
	return &idc
}

// While autoscaling is on the controller's apply does not own the
// Deployment's replicas: KEDA's HPA (another field manager, through the
// scale subresource) sets them and a pass that re-applies the Deployment
// leaves them as they are. Turned off, the declared replicas come back and
// the ScaledObject goes.
func TestDeploymentReplicasLeftToTheAutoscaler(t *testing.T) {
	e := newKEDAEnv(t)
	e.create(secretOf("db", "dsn"))
	idc := autoscaledConsumer("scaled", messagingv1alpha1.SourceSpec{NATSJetStream: &messagingv1alpha1.NATSJetStreamSource{URL: "nats://nats:4222", Stream: "ORDERS", Consumer: "scaled"}})
	e.create(idc)
	e.pass("scaled")
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "shop", Name: "scaled"}
	var d appsv1.Deployment
	if err := e.c.Get(ctx, key, &d); err != nil {
		t.Fatal(err)
	}
	if owns := ownsReplicas(d.ManagedFields, string(fieldOwner)); owns {
		t.Fatalf("the controller's apply owns spec.replicas under autoscaling: %v", d.ManagedFields)
	}
	// The HPA scales through the scale subresource, as its own manager.
	if err := e.c.SubResource("scale").Patch(ctx, &d, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":4}}`)), client.FieldOwner("horizontal-pod-autoscaler")); err != nil {
		t.Fatalf("scaling as the HPA: %v", err)
	}
	// A change that re-renders the Deployment (a pod annotation), then a pass.
	live := getIDC(t, e.c, "scaled")
	live.Spec.Runtime.PodAnnotations = map[string]string{"team": "orders"}
	if err := e.c.Update(ctx, live); err != nil {
		t.Fatal(err)
	}
	e.pass("scaled")
	if err := e.c.Get(ctx, key, &d); err != nil {
		t.Fatal(err)
	}
	if d.Spec.Template.Annotations["team"] != "orders" {
		t.Fatalf("the Deployment was not re-applied (annotations %v)", d.Spec.Template.Annotations)
	}
	if got := ptr.Deref(d.Spec.Replicas, -1); got != 4 {
		t.Fatalf("replicas %d after a pass, want the autoscaler's 4 left alone", got)
	}
	if st := getIDC(t, e.c, "scaled").Status.Runtime; st == nil || ptr.Deref(st.DesiredReplicas, -1) != 4 {
		t.Fatalf("status.runtime %+v: want desiredReplicas 4 (what the autoscaler set)", st)
	}

	// Autoscaling off: the declared replicas again, owned by the controller,
	// and no ScaledObject.
	live = getIDC(t, e.c, "scaled")
	live.Spec.Runtime.Autoscaling = nil
	live.Spec.Runtime.Replicas = ptr.To(int32(2))
	if err := e.c.Update(ctx, live); err != nil {
		t.Fatal(err)
	}
	e.pass("scaled")
	if err := e.c.Get(ctx, key, &d); err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(d.Spec.Replicas, -1) != 2 || !ownsReplicas(d.ManagedFields, string(fieldOwner)) {
		t.Fatalf("autoscaling off: replicas %v (owned by the controller: %v), want 2 and owned", ptr.Deref(d.Spec.Replicas, -1), ownsReplicas(d.ManagedFields, string(fieldOwner)))
	}
	so := &unstructured.Unstructured{}
	so.SetGroupVersionKind(specs.GVKScaledObject)
	err := e.c.Get(ctx, key, so)
	if err == nil && so.GetDeletionTimestamp() == nil {
		t.Fatal("autoscaling off: the ScaledObject is still there")
	}
}

// minReplicas 0 on a new resource: KEDA scales a ScaledObject that has
// never been active to 0 at its first poll (initialCooldownPeriod 0), and
// the JetStream scaler reads no lag from a durable that does not exist. The
// runtime creates the durable on its first start, so until the broker shows
// it the ScaledObject's minimum is held at 1, the reading is retried at
// --recheck-period, and the minimum is 0 again once the consumer exists.
func TestMinReplicasZeroWaitsForTheConsumer(t *testing.T) {
	e := newKEDAEnv(t)
	broker := e.r.opts.Broker.(*fakeBroker)
	clk := e.r.opts.Clock.(*testclock.FakeClock)
	broker.setConsumerMissing(true)
	e.create(secretOf("db", "dsn"))
	idc := autoscaledConsumer("fromzero", messagingv1alpha1.SourceSpec{NATSJetStream: &messagingv1alpha1.NATSJetStreamSource{URL: "nats://nats:4222", Stream: "ORDERS", Consumer: "fromzero"}})
	idc.Spec.Runtime.Autoscaling.MinReplicas = ptr.To(int32(0))
	e.create(idc)
	e.pass("fromzero")
	minCount := func() any {
		t.Helper()
		v, _, _ := unstructured.NestedFieldNoCopy(e.read("ScaledObject", "fromzero").Object, "spec", "minReplicaCount")
		return v
	}
	if got := minCount(); got != int64(1) {
		t.Fatalf("no consumer on the broker yet: minReplicaCount %v, want 1 (held until the runtime creates it)", got)
	}
	res, err := e.r.Reconcile(context.Background(), reqFor("shop", "fromzero"))
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > DefaultRecheckPeriod {
		t.Fatalf("awaiting the consumer: next pass in %s, want within --recheck-period %s", res.RequeueAfter, DefaultRecheckPeriod)
	}
	if st := getIDC(t, e.c, "fromzero").Status.Runtime; st == nil || !strings.Contains(st.ScaleReason, "held at 1 until the broker has the consumer") {
		t.Fatalf("status.runtime %+v: want the scale reason to say the minimum is held at 1 for the consumer", st)
	}

	broker.setConsumerMissing(false)
	clk.Step(DefaultRecheckPeriod + time.Second)
	reads := broker.readCount()
	e.pass("fromzero")
	if broker.readCount() == reads {
		t.Fatalf("the broker was not read again after --recheck-period while the consumer was missing")
	}
	if got := minCount(); got != int64(0) {
		t.Fatalf("the consumer exists: minReplicaCount %v, want the declared 0", got)
	}
}

// A partitioned resource on a real API server with KEDA's CRDs: one
// Deployment, ScaledObject and PodDisruptionBudget per partition, each
// scaling on its own durable; status.partitions with each partition's lag.
func TestPartitionedConsumerChildren(t *testing.T) {
	e := newKEDAEnv(t)
	e.r.opts.Broker.(*fakeBroker).partitionLags = []int64{5, 50, 500}
	e.create(secretOf("db", "dsn"))
	idc := autoscaledConsumer("parted", messagingv1alpha1.SourceSpec{NATSJetStream: &messagingv1alpha1.NATSJetStreamSource{
		URL: "nats://nats:4222", Stream: "ORDERS", Consumer: "parted", Partitions: ptr.To(int32(3))}})
	e.create(idc)
	e.pass("parted")
	ctx := context.Background()
	for i := range 3 {
		name := fmt.Sprintf("parted-p%d", i)
		var d appsv1.Deployment
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: name}, &d); err != nil {
			t.Fatalf("partition %d's Deployment: %v", i, err)
		}
		if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, fmt.Sprintf("--partition=%d", i)) {
			t.Errorf("%s runs %v, want --partition=%d", name, d.Spec.Template.Spec.Containers[0].Args, i)
		}
		so := e.read("ScaledObject", name)
		triggers, _, _ := unstructured.NestedSlice(so.Object, "spec", "triggers")
		if len(triggers) != 1 || triggers[0].(map[string]any)["metadata"].(map[string]any)["consumer"] != name {
			t.Errorf("%s's ScaledObject triggers %v, want the lag of consumer %s", name, triggers, name)
		}
	}
	var none appsv1.Deployment
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "parted"}, &none); err == nil {
		t.Errorf("a partitioned resource also got the unpartitioned Deployment parted")
	}
	st := getIDC(t, e.c, "parted").Status
	if len(st.Partitions) != 3 {
		t.Fatalf("status.partitions %+v, want 3", st.Partitions)
	}
	for i, p := range st.Partitions {
		want := []int64{5, 50, 500}[i]
		if int(p.Partition) != i || p.Consumer != fmt.Sprintf("parted-p%d", i) || p.Lag == nil || *p.Lag != want {
			t.Errorf("status.partitions[%d] = %+v, want partition %d, consumer parted-p%d, lag %d", i, p, i, i, want)
		}
	}
}

// ownsReplicas tells whether manager's fields include spec.replicas.
func ownsReplicas(fields []metav1.ManagedFieldsEntry, manager string) bool {
	for _, f := range fields {
		if f.Manager != manager || f.FieldsV1 == nil {
			continue
		}
		var set map[string]any
		if err := json.Unmarshal(f.FieldsV1.GetRawBytes(), &set); err != nil {
			continue
		}
		if spec, ok := set["f:spec"].(map[string]any); ok {
			if _, ok := spec["f:replicas"]; ok {
				return true
			}
		}
	}
	return false
}
