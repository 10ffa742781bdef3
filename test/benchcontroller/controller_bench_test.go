package benchcontroller

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

const (
	namespace     = "idc-bench"
	secretName    = "bench-db"
	inboxSchema   = "projections"
	streamMaxAge  = 48 * time.Hour
	defaultN      = 300
	defaultWithin = 12 * time.Minute
	// defaultSteady is how long the steady state after Ready is watched.
	defaultSteady = 5 * time.Minute
	// defaultPeriod is the manager's --retention-period in the run: short
	// enough that the steady state sees every resource's broker read
	// several times.
	defaultPeriod = time.Minute
)

// tablesPerIDC is the effect table (created up front, as a service's
// migration would) and every table of the inbox, from the inbox's own list
// (the resources neither emit nor redrive: no outbox, no redrives log).
var tablesPerIDC = 1 + len(inbox.NamesFor(config.Sink{InboxTable: "inbox_bench"}).Provisioned(inbox.Options{}))

// settings come from the environment so the Makefile target stays one line.
type settings struct {
	resources  int           // IDC_BENCH_RESOURCES
	within     time.Duration // IDC_BENCH_TIMEOUT: how long all may take to become Ready
	managerLog string        // IDC_BENCH_MANAGER_LOG: keep the manager's log there
	// IDC_BENCH_MAX_CONCURRENT sets --max-concurrent-reconciles; unset keeps
	// the manager's default.
	maxConcurrent string
	steady        time.Duration // IDC_BENCH_STEADY: how long the steady state is watched (0 skips it)
	period        time.Duration // IDC_BENCH_RETENTION_PERIOD: the manager's --retention-period
}

func readSettings(b *testing.B) settings {
	s := settings{resources: defaultN, within: defaultWithin, managerLog: os.Getenv("IDC_BENCH_MANAGER_LOG"), maxConcurrent: os.Getenv("IDC_BENCH_MAX_CONCURRENT"),
		steady: defaultSteady, period: defaultPeriod}
	for name, d := range map[string]*time.Duration{"IDC_BENCH_STEADY": &s.steady, "IDC_BENCH_RETENTION_PERIOD": &s.period} {
		if v := os.Getenv(name); v != "" {
			parsed, err := time.ParseDuration(v)
			if err != nil || parsed < 0 {
				b.Fatalf("%s=%q: want a Go duration", name, v)
			}
			*d = parsed
		}
	}
	if s.period <= 0 {
		b.Fatal("IDC_BENCH_RETENTION_PERIOD must be positive")
	}
	if v := os.Getenv("IDC_BENCH_RESOURCES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("IDC_BENCH_RESOURCES=%q: want a positive integer", v)
		}
		s.resources = n
	}
	if v := os.Getenv("IDC_BENCH_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("IDC_BENCH_TIMEOUT=%q: want a positive Go duration", v)
		}
		s.within = d
	}
	return s
}

func resourceName(i int) string { return fmt.Sprintf("bench-%04d", i) }

// newConsumer is the JetStream -> PostgreSQL upsert of the sample, with its
// own inbox table and JetStream consumer (two resources sharing either are
// a Conflict by design), on the shared database, schema and stream.
func newConsumer(i int, stream, subjectPrefix string) *messagingv1alpha1.IdempotentConsumer {
	name := resourceName(i)
	suffix := strings.ReplaceAll(name, "-", "_")
	return &messagingv1alpha1.IdempotentConsumer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: messagingv1alpha1.IdempotentConsumerSpec{
			Source: messagingv1alpha1.SourceSpec{NATSJetStream: &messagingv1alpha1.NATSJetStreamSource{
				URL: natsURL(), Stream: stream, Consumer: name, FilterSubject: fmt.Sprintf("%s.%04d.>", subjectPrefix, i),
			}},
			Message: messagingv1alpha1.MessageSpec{
				ID: messagingv1alpha1.IDSpec{Header: "Nats-Msg-Id"},
				Entity: &messagingv1alpha1.EntitySpec{
					Key:      messagingv1alpha1.FieldSpec{JSONPath: "$.orderId"},
					Sequence: messagingv1alpha1.FieldSpec{JSONPath: "$.version"},
				},
			},
			Sink: messagingv1alpha1.SinkSpec{
				Postgres: &messagingv1alpha1.PostgresSpec{ConnectionSecretRef: messagingv1alpha1.SecretKeyRef{Name: secretName, Key: "dsn"}, Schema: inboxSchema},
				Inbox:    messagingv1alpha1.InboxSpec{Table: messagingv1alpha1.SQLIdentifier("inbox_" + suffix)},
				Effect: messagingv1alpha1.EffectSpec{Upsert: &messagingv1alpha1.UpsertEffect{
					Table: messagingv1alpha1.SQLIdentifier("orders_" + suffix), Key: []messagingv1alpha1.SQLIdentifier{"order_id"},
					Columns:        messagingv1alpha1.Columns{"order_id": "$.orderId", "status": "$.status", "version": "$.version"},
					SequenceColumn: "version",
				}},
			},
			Runtime: messagingv1alpha1.RuntimeSpec{
				Replicas: ptr.To(int32(2)),
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
			},
		},
	}
}

// BenchmarkController measures how long the real manager takes to bring N
// IdempotentConsumers on one database to Ready, and its peak memory.
func BenchmarkController(b *testing.B) {
	s := readSettings(b)
	dir := b.TempDir()
	logPath := s.managerLog
	if logPath == "" {
		logPath = filepath.Join(dir, "manager.log")
	}

	// Registered first, cleaned up last: the manager stops, then envtest,
	// then the stream is deleted and the database dropped.
	dsn := newDatabase(b)
	s.createEffectTables(b, dsn)
	stream, subjectPrefix := newStream(b, streamMaxAge)
	bin := buildManager(b, dir)
	cl := startCluster(b, dir)
	var floor *floorResult
	if floorWanted() {
		f := runFloor(b, s, cl, stream, subjectPrefix)
		floor = &f
	}
	var extra []string
	if s.maxConcurrent != "" {
		extra = append(extra, "--max-concurrent-reconciles="+s.maxConcurrent)
	}
	mgr := startManager(b, bin, cl.kubeconfig, logPath, s.period, extra...)

	ctx, cancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	b.Cleanup(func() { cancel(); bg.Wait() })

	setupCtx, setupCancel := context.WithTimeout(ctx, time.Minute)
	defer setupCancel()
	c := cl.client
	if err := c.Create(setupCtx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		b.Fatalf("while creating namespace %s: %v", namespace, err)
	}
	if err := c.Create(setupCtx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: namespace},
		StringData: map[string]string{"dsn": dsn},
	}); err != nil {
		b.Fatalf("while creating Secret %s: %v", secretName, err)
	}
	requestsBefore, err := requestCounts(setupCtx, cl.clientset)
	if err != nil {
		b.Fatal(err)
	}

	n := s.resources
	deployments, inboxReady, ready := newFirstSeen(n), newFirstSeen(n), newFirstSeen(n)
	player := &deploymentPlayer{c: c, created: deployments}
	bg.Add(2)
	go func() { defer bg.Done(); player.run(ctx, c, namespace) }()
	go func() { defer bg.Done(); trackConsumers(ctx, c, namespace, inboxReady, ready) }()

	// The first write of a custom resource warms the kube-apiserver's CRD
	// handler (CEL programs, OpenAPI models: seconds on 2 cores); a dry run
	// does that before the clock starts without creating anything.
	warm := time.Now()
	if err := c.Create(setupCtx, newConsumer(0, stream, subjectPrefix), client.DryRunAll); err != nil {
		b.Fatalf("while warming up the kube-apiserver with a dry-run create: %v", err)
	}
	warmup := time.Since(warm)

	apiProfile := profileAPIServer(ctx, cl)
	b.ResetTimer()
	cpuBefore := cpuShares(mgr.cmd.Process.Pid)
	createdAt := make(map[string]time.Time, n)
	start := time.Now()
	for i := range n {
		idc := newConsumer(i, stream, subjectPrefix)
		createdAt[idc.Name] = time.Now()
		if err := c.Create(ctx, idc); err != nil {
			b.Fatalf("while creating IdempotentConsumer %s: %v", idc.Name, err)
		}
	}
	createsDone := time.Since(start)

	deadline := time.NewTimer(s.within)
	defer deadline.Stop()
	select {
	case <-ready.all:
	case <-deadline.C:
	case <-mgr.done:
		b.Fatalf("the manager exited with %v after %s, %d/%d Ready\n%s",
			mgr.waitErr, time.Since(start).Round(time.Millisecond), ready.count(), n, mgr.logTail(40))
	}
	b.StopTimer()
	cpuAfter := cpuShares(mgr.cmd.Process.Pid)
	if ready.count() < n {
		sum, _ := mgr.logSummary()
		b.Fatalf("%d/%d IdempotentConsumers Ready after %s; the others, by Ready reason:%s\nmanager log: %s",
			ready.count(), n, s.within, laggards(ctx, c), sum)
	}
	seconds := ready.last().Sub(start).Seconds()
	peak, current, err := mgr.memory()
	if err != nil {
		b.Fatal(err)
	}

	// Confirm through a direct read that every resource is Ready now, not
	// only once.
	var list messagingv1alpha1.IdempotentConsumerList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		b.Fatalf("while listing IdempotentConsumers: %v", err)
	}
	notReady := 0
	for i := range list.Items {
		if !conditionTrue(&list.Items[i], messagingv1alpha1.ConditionReady) {
			notReady++
		}
	}
	if len(list.Items) != n || notReady > 0 {
		b.Fatalf("after all reported Ready once, %d of %d listed are not Ready now:%s", notReady, len(list.Items), laggards(ctx, c))
	}

	fmt.Printf("BENCH controller resources=%d seconds_to_ready=%.1f manager_rss_mib=%.0f\n", n, seconds, peak)
	runCPU := map[string]float64{}
	for k, v := range cpuAfter {
		runCPU[k] = v - cpuBefore[k]
	}
	requestsAfter, err := requestCounts(ctx, cl.clientset)
	if err != nil {
		b.Fatal(err)
	}
	runRequests := map[string]float64{}
	for k, v := range requestsAfter {
		if d := v - requestsBefore[k]; d > 0 {
			runRequests[k] = d
		}
	}
	fmt.Printf("BENCH controller_cost resources=%d cpu_s=%.1f manager_cpu_ms_per_resource=%.1f requests_per_resource: %s\n",
		n, sumCPU(runCPU), 1000*runCPU["manager"]/float64(n), perResourceByVerb(runRequests, n))
	if floor != nil {
		fmt.Printf("BENCH controller_floor resources=%d seconds_to_done=%.1f cpu_s=%.1f concurrency=%d requests_per_resource: %s note=%q\n",
			n, floor.seconds, sumCPU(floor.cpu), s.concurrency(), perResourceByVerb(floor.requests, n),
			"FLOOR: creates, child applies, Deployment status writes, inbox DDL, one status patch and one event per resource; no reads, no logic; not a product figure")
		fmt.Printf("RATIO controller_vs_floor=%.2f\n", seconds/floor.seconds)
		fmt.Printf("RATIO controller_cpu_vs_floor=%.2f\n", sumCPU(runCPU)/sumCPU(floor.cpu))
		diag("floor CPU per process:%s", cpuDelta(map[string]float64{}, floor.cpu))
		diag("floor kube-apiserver requests (count verb resource code):%s", requestDelta(map[string]float64{}, floor.requests))
	}
	b.ReportMetric(seconds, "s_to_ready")
	b.ReportMetric(peak, "rss_peak_MiB")
	b.ReportMetric(current, "rss_MiB")

	// Diagnostics for reading the number, not part of it. They go to stderr:
	// the testing package cuts a benchmark's log after ten lines.
	cpu, err := mgr.cpuSeconds()
	if err != nil {
		b.Fatal(err)
	}
	anon, file, err := mgr.rssParts()
	if err != nil {
		b.Fatal(err)
	}
	lat := ready.latencies(createdAt)
	diag("dry-run warm-up create: %s", warmup.Round(time.Millisecond))
	diag("creates: %d in %s; all Deployments seen at %s; all InboxReady at %s; all Ready at %s; manager VmHWM %.0f MiB, VmRSS %.0f MiB, CPU %.1fs",
		n, createsDone.Round(time.Millisecond), sinceStart(deployments.last(), start), sinceStart(inboxReady.last(), start),
		sinceStart(ready.last(), start), peak, current, cpu)
	diag("CPU from the first create to the last Ready, per process (the machine has %d cores):%s", runtime.NumCPU(), cpuDelta(cpuBefore, cpuAfter))
	diag("manager resident memory now: %.0f MiB anonymous (heap, stacks, runtime), %.0f MiB file-backed (the binary)", anon, file)
	diag("create -> Ready per resource: p50 %s, p90 %s, max %s",
		percentile(lat, 0.5).Round(time.Millisecond), percentile(lat, 0.9).Round(time.Millisecond), percentile(lat, 1).Round(time.Millisecond))
	if path := os.Getenv("IDC_BENCH_HEAP_PROFILE"); path != "" {
		if err := mgr.saveHeapProfile(path); err != nil {
			diag("saving the heap profile: %v", err)
		} else {
			diag("heap profile of the manager once all were Ready: %s (go tool pprof -sample_index=inuse_space %s)", path, path)
		}
	}
	apiProfile()
	if phases, err := mgr.phaseTimes(); err != nil {
		diag("%v", err)
	} else {
		diag("manager time per phase (total/passes, mean), slowest first:%s", phases)
	}
	player.mu.Lock()
	diag("Deployment player: %d status writes, %d conflicts, %d other failures (last: %v)", player.marked, player.conflicts, player.failure, player.lastErr)
	player.mu.Unlock()
	if tables, err := countTables(ctx, dsn, inboxSchema); err != nil {
		diag("counting the provisioned tables: %v", err)
	} else if tables != tablesPerIDC*n {
		b.Errorf("schema %s holds %d tables, want %d (%d per resource)", inboxSchema, tables, tablesPerIDC*n, tablesPerIDC)
	}
	diag("kube-apiserver requests during the run (count verb resource code; the benchmark's own: POST idempotentconsumers, PUT deployments/status, LIST/WATCH):%s",
		requestDelta(requestsBefore, requestsAfter))
	if sum, err := mgr.logSummary(); err != nil {
		diag("reading the manager's log: %v", err)
	} else {
		where := logPath
		if s.managerLog == "" {
			where = "removed at exit; set IDC_BENCH_MANAGER_LOG to keep it"
		}
		diag("manager log (%s): %s", where, sum)
	}
	if s.steady > 0 {
		steadyState(ctx, b, s, mgr, cl, n)
	}
}

// steadyState watches the cluster after every resource is Ready, with
// nothing changing, and counts what the manager writes and reads: status
// and child writes from the kube-apiserver's own request counts, broker
// reads from the manager's counter. Status and child writes must be 0;
// broker reads about resources x duration / --retention-period.
func steadyState(ctx context.Context, b *testing.B, s settings, mgr *managerProcess, cl *cluster, n int) {
	b.Helper()
	counters := []string{"idc_controller_broker_reads_total", "idc_controller_status_patches_total", "idc_controller_child_applies_total"}
	// snapshot reads the kube-apiserver's request counts and the manager's
	// counters and memory at one moment.
	snapshot := func() (req, m map[string]float64, peak, rss float64) {
		req, err := requestCounts(ctx, cl.clientset)
		if err != nil {
			b.Fatal(err)
		}
		if m, err = mgr.counters(counters...); err != nil {
			b.Fatal(err)
		}
		peak, rss, _ = mgr.memory()
		return req, m, peak, rss
	}
	reqBefore, mBefore, _, rssBefore := snapshot()
	select {
	case <-time.After(s.steady):
	case <-mgr.done:
		b.Fatalf("the manager exited during the steady state: %v\n%s", mgr.waitErr, mgr.logTail(40))
	}
	reqAfter, mAfter, peak, rssAfter := snapshot()
	var statusWrites, childWrites float64
	for key, v := range reqAfter {
		verb, res, _ := strings.Cut(key, " ")
		res, _, _ = strings.Cut(res, " ")
		d := v - reqBefore[key]
		switch {
		case d == 0 || verb == "GET" || verb == "LIST" || verb == "WATCH":
		case res == "idempotentconsumers/status":
			statusWrites += d
		case res == "deployments/status":
			// The benchmark's own Deployment player.
		case res == "configmaps" || res == "deployments" || res == "cronjobs" || res == "jobs" || res == "poddisruptionbudgets" || res == "networkpolicies":
			childWrites += d
		}
	}
	reads := mAfter["idc_controller_broker_reads_total"] - mBefore["idc_controller_broker_reads_total"]
	expected := float64(n) * s.steady.Seconds() / s.period.Seconds()
	fmt.Printf("BENCH controller_steady resources=%d seconds=%.0f retention_period=%s status_writes=%.0f child_writes=%.0f broker_reads=%.0f broker_reads_expected=%.0f manager_rss_mib=%.0f\n",
		n, s.steady.Seconds(), s.period, statusWrites, childWrites, reads, expected, rssAfter)
	diag("steady state: the manager counted %.0f status patches and %.0f child applies; VmRSS %.0f -> %.0f MiB (VmHWM %.0f); kube-apiserver requests:%s",
		mAfter["idc_controller_status_patches_total"]-mBefore["idc_controller_status_patches_total"],
		mAfter["idc_controller_child_applies_total"]-mBefore["idc_controller_child_applies_total"], rssBefore, rssAfter, peak, requestDelta(reqBefore, reqAfter))
	if statusWrites != 0 || childWrites != 0 {
		b.Errorf("steady state: %.0f status writes and %.0f child writes in %s, want 0", statusWrites, childWrites, s.steady)
	}
	// One read per resource per period, +10% jitter, +-1 period at the ends.
	if reads < expected*0.7 || reads > expected*1.3+float64(n) {
		b.Errorf("steady state: %.0f broker reads in %s, want about %.0f (resources x duration / --retention-period)", reads, s.steady, expected)
	}
}

// profileAPIServer takes a CPU profile of the kube-apiserver from now for
// IDC_BENCH_APISERVER_PROFILE_SECONDS (default 60) into the file
// IDC_BENCH_APISERVER_PROFILE names, when it is set; the function it
// returns waits for the profile and says where it went.
func profileAPIServer(ctx context.Context, cl *cluster) func() {
	path := os.Getenv("IDC_BENCH_APISERVER_PROFILE")
	if path == "" {
		return func() {}
	}
	seconds := "60"
	if v := os.Getenv("IDC_BENCH_APISERVER_PROFILE_SECONDS"); v != "" {
		seconds = v
	}
	done := make(chan error, 1)
	go func() {
		raw, err := cl.clientset.RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", seconds).Timeout(10 * time.Minute).DoRaw(ctx)
		if err == nil {
			err = os.WriteFile(path, raw, 0o600)
		}
		done <- err
	}()
	return func() {
		if err := <-done; err != nil {
			diag("kube-apiserver CPU profile: %v", err)
			return
		}
		diag("kube-apiserver CPU profile of the first %s s: %s (go tool pprof -top %s)", seconds, path, path)
	}
}

func diag(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchcontroller: "+format+"\n", args...)
}

func sinceStart(t, start time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.Sub(start).Round(time.Millisecond).String()
}

// laggards groups the resources that are not Ready by their Ready reason,
// with one example message each.
func laggards(ctx context.Context, c client.Client) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var list messagingv1alpha1.IdempotentConsumerList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return fmt.Sprintf(" (listing failed: %v)", err)
	}
	type group struct {
		count   int
		example string
	}
	groups := map[string]*group{}
	for i := range list.Items {
		idc := &list.Items[i]
		if conditionTrue(idc, messagingv1alpha1.ConditionReady) {
			continue
		}
		key, msg := "<no Ready condition>", ""
		if cond := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionReady); cond != nil {
			key = fmt.Sprintf("%s/%s", cond.Status, cond.Reason)
			if cond.ObservedGeneration != idc.Generation {
				key += fmt.Sprintf(" (condition of generation %d, object at %d)", cond.ObservedGeneration, idc.Generation)
			}
			msg = cond.Message
		}
		if groups[key] == nil {
			groups[key] = &group{example: idc.Name + ": " + msg}
		}
		groups[key].count++
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return groups[keys[i]].count > groups[keys[j]].count })
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "\n  %4d  %s  e.g. %s", groups[k].count, k, groups[k].example)
	}
	return sb.String()
}
