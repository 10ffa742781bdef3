package benchcontroller

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// The controller's floor: in the same run as the manager, against the same
// kube-apiserver, etcd and PostgreSQL server, at the manager's concurrency,
// a client that does for each resource only what no manager can leave out:
// the benchmark's create, the child applies the manager would make
// (rendered with internal/specs, the manager's own renderers), the
// benchmark's Deployment status write, the inbox DDL through the runtime's
// own migration code (runtime/inbox), one status patch and one event. No
// reads, no logic. It is a floor to measure the manager against, never a
// product figure.
//
// It runs before the manager starts, in its own namespace and its own
// database on the same server; its objects are deleted and its database
// dropped before the manager's clock starts, so the manager never sees
// them (etcd keeps their history: the manager runs on the larger store).
const (
	floorNamespace = "idc-bench-floor"
	// floorEnv=0 skips the floor.
	floorEnv = "IDC_BENCH_FLOOR"
	// windowForFloor is the retention window the floor renders the prune
	// CronJob with (the stream's MaxAge bounds the manager's).
	windowForFloor = streamMaxAge
)

// floorResult is what the floor measured.
type floorResult struct {
	seconds  float64
	cpu      map[string]float64 // per process, the floor's own client in "benchmark"
	requests map[string]float64 // kube-apiserver requests during it
}

func floorWanted() bool { return os.Getenv(floorEnv) != "0" }

// concurrency is the manager's --max-concurrent-reconciles in this run.
func (s settings) concurrency() int {
	if n, err := strconv.Atoi(s.maxConcurrent); err == nil && n > 0 {
		return n
	}
	return 4 // the manager's default
}

// runFloor runs the floor for n resources and removes what it made.
func runFloor(b *testing.B, s settings, cl *cluster, stream, subjectPrefix string) floorResult {
	b.Helper()
	ctx := context.Background()
	c := cl.client
	dsn := newDatabase(b)
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	pc.MaxConns = sinkdb.MaxConnsPerDatabase // as the manager's pool per database
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: floorNamespace}}); err != nil {
		b.Fatalf("while creating namespace %s: %v", floorNamespace, err)
	}
	warm := newConsumer(0, stream, subjectPrefix)
	warm.Namespace = floorNamespace
	if err := c.Create(ctx, warm, client.DryRunAll); err != nil {
		b.Fatalf("floor: warming up the kube-apiserver with a dry-run create: %v", err)
	}
	before, err := requestCounts(ctx, cl.clientset)
	if err != nil {
		b.Fatal(err)
	}

	n := s.resources
	work := make(chan *messagingv1alpha1.IdempotentConsumer, n)
	// The manager's gate on concurrent inbox migrations per database.
	migrations := make(chan struct{}, sinkdb.MaxMigrationsPerDatabase)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
		}
	}
	cpuBefore := cpuShares(0)
	start := time.Now()
	for range s.concurrency() {
		wg.Go(func() {
			for idc := range work {
				if err := floorOne(ctx, c, pool, migrations, idc); err != nil {
					fail(fmt.Errorf("floor: %s: %w", idc.Name, err))
				}
			}
		})
	}
	// The creates, one at a time as the benchmark makes the manager's.
	for i := range n {
		idc := newConsumer(i, stream, subjectPrefix)
		idc.Namespace = floorNamespace
		if err := c.Create(ctx, idc); err != nil {
			b.Fatalf("floor: while creating IdempotentConsumer %s: %v", idc.Name, err)
		}
		work <- idc
	}
	close(work)
	wg.Wait()
	seconds := time.Since(start).Seconds()
	cpuAfter := cpuShares(0)
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	after, err := requestCounts(ctx, cl.clientset)
	if err != nil {
		b.Fatal(err)
	}
	cpu := map[string]float64{}
	for k, v := range cpuAfter {
		cpu[k] = v - cpuBefore[k]
	}
	reqs := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			reqs[k] = d
		}
	}

	// Gone before the manager starts: it would reconcile them otherwise.
	// envtest runs no garbage collector, so the children go one kind at a
	// time.
	for _, obj := range []client.Object{&messagingv1alpha1.IdempotentConsumer{}, &corev1.ConfigMap{}, &appsv1.Deployment{}, &batchv1.CronJob{},
		&policyv1.PodDisruptionBudget{}} {
		if err := c.DeleteAllOf(ctx, obj, client.InNamespace(floorNamespace)); err != nil {
			b.Fatalf("floor: while deleting its %T objects: %v", obj, err)
		}
	}
	pool.Close()
	dropDatabase(b, dsnDatabase(dsn))
	return floorResult{seconds: seconds, cpu: cpu, requests: reqs}
}

func dsnDatabase(dsn string) string {
	i := strings.LastIndexByte(dsn, '/')
	name, _, _ := strings.Cut(dsn[i+1:], "?")
	return name
}

// floorOne is the floor's work for one resource: the child applies, the
// Deployment's status, the inbox DDL, one status patch and one event.
func floorOne(ctx context.Context, c client.Client, pool *pgxpool.Pool, migrations chan struct{}, idc *messagingv1alpha1.IdempotentConsumer) error {
	rc, err := controllers.RuntimeConfigFor(idc)
	if err != nil {
		return err
	}
	const image, secretsHash = "idc-operator:bench", "floor"
	dep := specs.Deployment(idc, rc, image, secretsHash, specs.Workloads(idc)[0])
	children := []client.Object{specs.ConfigMap(idc, rc), dep, specs.PruneCronJob(idc, rc, image, secretsHash, windowForFloor), specs.PodDisruptionBudget(idc, specs.Workloads(idc)[0])}
	var applied *unstructured.Unstructured
	for _, obj := range children {
		u, err := applyChild(ctx, c, idc, obj)
		if err != nil {
			return err
		}
		if obj == dep {
			applied = u
		}
	}
	// The benchmark's Deployment status write (its Deployment player).
	var d appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(applied.Object, &d); err != nil {
		return err
	}
	replicas := *dep.Spec.Replicas
	now := metav1.Now()
	d.Status = appsv1.DeploymentStatus{
		ObservedGeneration: d.Generation, Replicas: replicas, ReadyReplicas: replicas, AvailableReplicas: replicas, UpdatedReplicas: replicas,
		Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable",
			Message: "Deployment has minimum availability.", LastUpdateTime: now, LastTransitionTime: now}},
	}
	if err := c.Status().Update(ctx, &d); err != nil {
		return fmt.Errorf("writing the Deployment's status: %w", err)
	}

	// The inbox DDL, through the runtime's migration code, under the
	// manager's gate.
	store, err := inbox.New(pool, rc.Config.Sink)
	if err != nil {
		return err
	}
	migrations <- struct{}{}
	id, err := store.MigrateFor(ctx, &inbox.OwnerClaim{Owner: inbox.Owner{Cluster: "floor", Namespace: idc.Namespace, Name: idc.Name, UID: string(idc.UID)}})
	<-migrations
	if err != nil {
		return err
	}

	// One status patch: what the manager's last one says.
	base := idc.DeepCopy()
	idc.Status = floorStatus(idc, id.Epoch, replicas)
	if err := c.Status().Patch(ctx, idc, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("patching the status: %w", err)
	}
	// One event (events.k8s.io, as the manager's recorder posts).
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", idc.Name, time.Now().UnixNano()), Namespace: idc.Namespace},
		EventTime:  metav1.NewMicroTime(time.Now()), ReportingController: "idc-operator", ReportingInstance: "idc-operator-floor",
		Action: "Reconcile", Reason: "Ready", Type: corev1.EventTypeNormal,
		Regarding: corev1.ObjectReference{Kind: "IdempotentConsumer", APIVersion: messagingv1alpha1.GroupVersion.String(), Namespace: idc.Namespace,
			Name: idc.Name, UID: idc.UID, ResourceVersion: idc.ResourceVersion},
		Note: "InboxReady: inbox created; EffectReady: the effect table is ready; RuntimeReady: 2/2 replicas ready; PruneScheduled: prune is scheduled",
	}
	if err := c.Create(ctx, ev); err != nil {
		return fmt.Errorf("posting the event: %w", err)
	}
	return nil
}

// applyChild server-side-applies obj owned by idc, as the manager's apply
// does (the same field manager, forced), and returns what the server
// answered.
func applyChild(ctx context.Context, c client.Client, idc *messagingv1alpha1.IdempotentConsumer, obj client.Object) (*unstructured.Unstructured, error) {
	gvk := obj.GetObjectKind().GroupVersionKind()
	if err := controllerutil.SetControllerReference(idc, obj, c.Scheme()); err != nil {
		return nil, err
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("idc-operator"), client.ForceOwnership); err != nil {
		return nil, fmt.Errorf("applying %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	return u, nil
}

// floorStatus is a Ready resource's status, about the size of the
// manager's.
func floorStatus(idc *messagingv1alpha1.IdempotentConsumer, epoch string, replicas int32) messagingv1alpha1.IdempotentConsumerStatus {
	now := metav1.Now()
	cond := func(typ, status, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: metav1.ConditionStatus(status), Reason: reason, Message: msg, ObservedGeneration: idc.Generation, LastTransitionTime: now}
	}
	return messagingv1alpha1.IdempotentConsumerStatus{
		ObservedGeneration: idc.Generation,
		Conditions: []metav1.Condition{
			cond(messagingv1alpha1.ConditionReady, "True", "Ready", "the consumer is running"),
			cond(messagingv1alpha1.ConditionInboxReady, "True", "Ready", "inbox tables are at schema version "+strconv.Itoa(inbox.SchemaVersion)),
			cond(messagingv1alpha1.ConditionEffectReady, "True", "Ready", "the effect table exists with the columns the upsert writes"),
			cond(messagingv1alpha1.ConditionRuntimeReady, "True", "Ready", fmt.Sprintf("%d/%d replicas ready", replicas, replicas)),
			cond(messagingv1alpha1.ConditionPruneScheduled, "True", "Scheduled", "prune runs on the schedule"),
			cond(messagingv1alpha1.ConditionRetentionResolved, "True", "Resolved", "the stream's MaxAge bounds replay"),
			cond(messagingv1alpha1.ConditionReconciling, "False", "Reconciled", "up to date"),
			cond(messagingv1alpha1.ConditionStalled, "False", "Reconciled", "not stalled"),
		},
		Source:    "nats-jetstream " + idc.Spec.Source.NATSJetStream.Stream,
		Guarantee: messagingv1alpha1.GuaranteeExactlyOnceEffect,
		Inbox: &messagingv1alpha1.InboxStatus{Table: inboxSchema + "." + string(idc.Spec.Sink.Inbox.Table), Layout: messagingv1alpha1.InboxLayoutTable,
			SchemaVersion: int32(inbox.SchemaVersion), Epoch: epoch, Database: "floor"},
		Runtime: &messagingv1alpha1.RuntimeStatus{Deployment: idc.Name, Replicas: replicas, ReadyReplicas: replicas, Selector: specs.Selector(idc)},
	}
}

// perResourceByVerb is requests per resource by verb ("GET 3.00 (404: 0.00) PATCH 5.00 ..."),
// every resource kind the benchmark counts together.
func perResourceByVerb(reqs map[string]float64, n int) string {
	verbs := map[string]float64{}
	notFound := 0.0
	for key, v := range reqs {
		f := strings.Fields(key) // VERB resource code
		verbs[f[0]] += v
		if f[0] == "GET" && len(f) == 3 && f[2] == "404" {
			notFound += v
		}
	}
	names := make([]string, 0, len(verbs))
	for v := range verbs {
		names = append(names, v)
	}
	sort.Strings(names)
	var sb strings.Builder
	for _, v := range names {
		fmt.Fprintf(&sb, " %s=%.2f", strings.ToLower(v), verbs[v]/float64(n))
	}
	fmt.Fprintf(&sb, " get_404=%.2f", notFound/float64(n))
	return strings.TrimSpace(sb.String())
}

func sumCPU(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}
