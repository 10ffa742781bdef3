package benchcontroller

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// cluster is envtest's control plane with a direct (uncached) client for the
// benchmark and a kubeconfig for the manager subprocess.
type cluster struct {
	cfg        *rest.Config
	client     client.WithWatch
	clientset  *kubernetes.Clientset
	kubeconfig string
}

func startCluster(b *testing.B, dir string) *cluster {
	b.Helper()
	env, err := testenv.New()
	if err != nil {
		b.Fatalf("while preparing envtest: %v", err)
	}
	cfg, err := env.Start()
	if err != nil {
		b.Fatalf("while starting envtest: %v", err)
	}
	b.Cleanup(func() {
		if err := env.Stop(); err != nil {
			b.Errorf("while stopping envtest: %v", err)
		}
	})

	// The manager gets its own admin user, as a kubeconfig file.
	user, err := env.AddUser(envtest.User{Name: "idc-operator", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		b.Fatalf("while adding the manager's user: %v", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		b.Fatalf("while rendering the kubeconfig: %v", err)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		b.Fatalf("while writing the kubeconfig: %v", err)
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	if err := messagingv1alpha1.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0 // the benchmark's own client is not the bottleneck
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		b.Fatalf("while creating the client: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatalf("while creating the clientset: %v", err)
	}
	return &cluster{cfg: cfg, client: c, clientset: cs, kubeconfig: path}
}

// firstSeen records the first time something happened to each name.
type firstSeen struct {
	mu   sync.Mutex
	at   map[string]time.Time
	want int
	all  chan struct{} // closed when want names were seen
}

func newFirstSeen(want int) *firstSeen {
	return &firstSeen{at: map[string]time.Time{}, want: want, all: make(chan struct{})}
}

func (f *firstSeen) see(name string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.at[name]; ok {
		return
	}
	f.at[name] = now
	if len(f.at) == f.want {
		close(f.all)
	}
}

func (f *firstSeen) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.at)
}

// last is the time the last name was seen (zero before all were).
func (f *firstSeen) last() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var t time.Time
	if len(f.at) < f.want {
		return t
	}
	for _, at := range f.at {
		if at.After(t) {
			t = at
		}
	}
	return t
}

// latencies returns, sorted, seen-time minus start-time per name.
func (f *firstSeen) latencies(start map[string]time.Time) []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]time.Duration, 0, len(f.at))
	for name, at := range f.at {
		if s, ok := start[name]; ok {
			out = append(out, at.Sub(s))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(p*float64(len(ds))))]
}

// watchLoop lists then watches list's kind in ns, calling fn for every
// object it sees, and re-lists when the watch ends, until ctx is done.
func watchLoop[T client.Object](ctx context.Context, c client.WithWatch, ns string, list client.ObjectList, items func() []T, fn func(T)) {
	for ctx.Err() == nil {
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			sleepCtx(ctx, 500*time.Millisecond)
			continue
		}
		for _, o := range items() {
			fn(o)
		}
		w, err := c.Watch(ctx, list, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})
		if err != nil {
			sleepCtx(ctx, 500*time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(T); ok {
				fn(o)
			}
		}
		w.Stop()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// conditionTrue is a True condition of the object's current generation.
func conditionTrue(idc *messagingv1alpha1.IdempotentConsumer, typ string) bool {
	c := meta.FindStatusCondition(idc.Status.Conditions, typ)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == idc.Generation
}

// trackConsumers records when each resource first reports InboxReady and Ready.
func trackConsumers(ctx context.Context, c client.WithWatch, ns string, inboxReady, ready *firstSeen) {
	var list messagingv1alpha1.IdempotentConsumerList
	watchLoop(ctx, c, ns, &list, func() []*messagingv1alpha1.IdempotentConsumer {
		out := make([]*messagingv1alpha1.IdempotentConsumer, len(list.Items))
		for i := range list.Items {
			out[i] = &list.Items[i]
		}
		return out
	}, func(idc *messagingv1alpha1.IdempotentConsumer) {
		now := time.Now()
		if conditionTrue(idc, messagingv1alpha1.ConditionInboxReady) {
			inboxReady.see(idc.Name, now)
		}
		if conditionTrue(idc, messagingv1alpha1.ConditionReady) {
			ready.see(idc.Name, now)
		}
	})
}

// deploymentPlayer plays the Deployment controller, which envtest does not
// run: every Deployment that appears or changes generation is reported
// observed, with all replicas ready and Available=True.
type deploymentPlayer struct {
	c       client.Client
	created *firstSeen
	// counters, read after the run
	mu                         sync.Mutex
	marked, conflicts, failure int
	lastErr                    error
}

func (p *deploymentPlayer) run(ctx context.Context, c client.WithWatch, ns string) {
	var list appsv1.DeploymentList
	watchLoop(ctx, c, ns, &list, func() []*appsv1.Deployment {
		out := make([]*appsv1.Deployment, len(list.Items))
		for i := range list.Items {
			out[i] = &list.Items[i]
		}
		return out
	}, func(d *appsv1.Deployment) { p.observe(ctx, d) })
}

func available(d *appsv1.Deployment) bool {
	if d.Status.ObservedGeneration < d.Generation || d.Status.ReadyReplicas != ptr.Deref(d.Spec.Replicas, 1) {
		return false
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (p *deploymentPlayer) observe(ctx context.Context, d *appsv1.Deployment) {
	if !d.DeletionTimestamp.IsZero() {
		return
	}
	p.created.see(d.Name, time.Now())
	if available(d) {
		return
	}
	n := ptr.Deref(d.Spec.Replicas, 1)
	now := metav1.Now()
	d = d.DeepCopy()
	d.Status = appsv1.DeploymentStatus{
		ObservedGeneration: d.Generation, Replicas: n, ReadyReplicas: n, AvailableReplicas: n, UpdatedReplicas: n,
		Conditions: []appsv1.DeploymentCondition{{
			Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, Reason: "MinimumReplicasAvailable",
			Message: "Deployment has minimum availability.", LastUpdateTime: now, LastTransitionTime: now,
		}},
	}
	err := p.c.Status().Update(ctx, d)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		p.marked++
	case apierrors.IsConflict(err):
		// A newer version exists; its watch event brings it back here.
		p.conflicts++
	case apierrors.IsNotFound(err) || ctx.Err() != nil:
	default:
		p.failure++
		p.lastErr = err
	}
}

// requestCounts reads the kube-apiserver's apiserver_request_total counter by
// "VERB resource[/subresource] code", for the resources the controller touches.
func requestCounts(ctx context.Context, cs *kubernetes.Clientset) (map[string]float64, error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("while reading the kube-apiserver metrics: %w", err)
	}
	interesting := map[string]bool{"idempotentconsumers": true, "deployments": true, "cronjobs": true, "configmaps": true, "secrets": true, "events": true, "jobs": true,
		"poddisruptionbudgets": true, "networkpolicies": true}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		labels := parseLabels(line[len("apiserver_request_total{"):end])
		if !interesting[labels["resource"]] || labels["dry_run"] != "" {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			continue
		}
		res := labels["resource"]
		if s := labels["subresource"]; s != "" {
			res += "/" + s
		}
		out[labels["verb"]+" "+res+" "+labels["code"]] += v
	}
	return out, sc.Err()
}

var labelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for _, m := range labelRE.FindAllStringSubmatch(s, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// requestDelta formats after-before, one "count VERB resource code" per line.
func requestDelta(before, after map[string]float64) string {
	keys := make([]string, 0, len(after))
	for k, v := range after {
		if v-before[k] > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "\n  %6.0f  %s", after[k]-before[k], k)
	}
	return sb.String()
}
