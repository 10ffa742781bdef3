package podrunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Options configures a Runner.
type Options struct {
	// Namespace whose workloads run here.
	Namespace string
	// Commands maps a container's command[0] (a path in the image, such as
	// "/idc-runtime") to a local executable.
	Commands map[string]string
	// WorkDir holds each pod's directory (volumes) and logs/<pod>.log.
	WorkDir string
	// Output, when set, also receives every process's output, each line
	// prefixed with "[pod-name] ".
	Output io.Writer
	// PortEnv maps a container port name to an environment variable that
	// receives "127.0.0.1:<local port>", so replicas on one machine do not
	// collide; a variable the pod spec sets itself is left alone.
	PortEnv map[string]string
	// RewriteFile, when set, may change files materialised from ConfigMap
	// and Secret volumes (for programs that read their listen address from
	// a mounted file).
	RewriteFile RewriteFunc
	// ProbeInterval is how often readiness is polled (default 500ms).
	ProbeInterval time.Duration
	// RestartBackoff and MaxRestartBackoff bound the wait before a process
	// is started again (default 1s, doubling to 20s).
	RestartBackoff, MaxRestartBackoff time.Duration
	// MaxGracePeriod caps terminationGracePeriodSeconds (default 15s).
	MaxGracePeriod time.Duration
	// ResyncPeriod is how often everything is synced besides watch events
	// (default 2s).
	ResyncPeriod time.Duration
	// RunSchedules makes the runner create Jobs from CronJobs on their
	// schedule; TriggerCronJob works either way.
	RunSchedules bool
	// Log receives the runner's own events.
	Log logr.Logger
}

func (o *Options) defaults() error {
	if o.Namespace == "" {
		return errors.New("podrunner: Options.Namespace is required")
	}
	if o.WorkDir == "" {
		return errors.New("podrunner: Options.WorkDir is required")
	}
	setDefault(&o.ProbeInterval, 500*time.Millisecond)
	setDefault(&o.RestartBackoff, time.Second)
	setDefault(&o.MaxRestartBackoff, 20*time.Second)
	setDefault(&o.MaxGracePeriod, 15*time.Second)
	setDefault(&o.ResyncPeriod, 2*time.Second)
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	return nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// Runner runs a namespace's Deployments, Jobs and CronJobs as local
// processes. Create it with New, run it with Run.
type Runner struct {
	opts Options
	c    client.WithWatch
	res  *resolver
	wake chan struct{}

	mu          sync.Mutex
	podCtx      context.Context
	deployments map[string]*deploymentRun
	jobs        map[types.UID]*jobRun
	crons       map[string]*cronState
	stopping    sync.WaitGroup
}

// New builds a Runner talking to the API server of cfg.
func New(cfg *rest.Config, opts Options) (*Runner, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("podrunner: building the client: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(opts.WorkDir, "logs"), 0o755); err != nil {
		return nil, err
	}
	return &Runner{
		opts: opts,
		c:    c,
		res:  &resolver{reader: c, namespace: opts.Namespace, commands: opts.Commands, rewrite: opts.RewriteFile, portEnv: opts.PortEnv},
		wake: make(chan struct{}, 1),

		deployments: map[string]*deploymentRun{},
		jobs:        map[types.UID]*jobRun{},
		crons:       map[string]*cronState{},
	}, nil
}

// Run syncs until ctx ends, then stops every process gracefully and
// returns.
func (r *Runner) Run(ctx context.Context) error {
	r.mu.Lock()
	// Pods outlive ctx until they are stopped explicitly, gracefully.
	r.podCtx = context.WithoutCancel(ctx)
	r.mu.Unlock()
	for _, list := range []client.ObjectList{&appsv1.DeploymentList{}, &batchv1.JobList{}, &batchv1.CronJobList{}} {
		go r.watch(ctx, list)
	}
	t := time.NewTicker(r.opts.ResyncPeriod)
	defer t.Stop()
	defer r.stopAll()
	for {
		r.sync(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-r.wake:
		}
	}
}

// poke asks for a sync soon; it never blocks.
func (r *Runner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// watch pokes the sync loop on every change of a kind, re-watching when the
// watch ends.
func (r *Runner) watch(ctx context.Context, list client.ObjectList) {
	for ctx.Err() == nil {
		w, err := r.c.Watch(ctx, list, client.InNamespace(r.opts.Namespace))
		if err == nil {
			for range w.ResultChan() {
				r.poke()
			}
			w.Stop()
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (r *Runner) sync(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.syncDeployments(ctx); err != nil && ctx.Err() == nil {
		r.opts.Log.Error(err, "syncing Deployments")
	}
	if err := r.syncJobs(ctx); err != nil && ctx.Err() == nil {
		r.opts.Log.Error(err, "syncing Jobs")
	}
	if !r.opts.RunSchedules {
		return
	}
	if err := r.syncSchedules(ctx, time.Now()); err != nil && ctx.Err() == nil {
		r.opts.Log.Error(err, "syncing CronJob schedules")
	}
}

// stopInBackground stops pods without holding up the sync loop; stopAll
// waits for them.
func (r *Runner) stopInBackground(pods ...*pod) {
	for _, p := range pods {
		r.stopping.Add(1)
		go func() {
			defer r.stopping.Done()
			p.stop()
			r.poke()
		}()
	}
}

func (r *Runner) stopAll() {
	r.mu.Lock()
	for name, d := range r.deployments {
		r.stopInBackground(d.pods...)
		delete(r.deployments, name)
	}
	for uid, j := range r.jobs {
		r.stopInBackground(j.pod)
		delete(r.jobs, uid)
	}
	r.mu.Unlock()
	r.stopping.Wait()
}

// podTemplate is what a new pod is made from.
type podTemplate struct {
	owner         string
	namePrefix    string
	template      *corev1.PodTemplateSpec
	restartPolicy corev1.RestartPolicy
	backoffLimit  int
}

// startPod synthesizes a pod (name, uid, local ports) and starts it.
func (r *Runner) startPod(t podTemplate) (*pod, error) {
	name := t.namePrefix + rand.String(5)
	ports, err := allocatePorts(t.template.Spec.Containers)
	if err != nil {
		return nil, err
	}
	id := &podIdentity{
		name: name, namespace: r.opts.Namespace, uid: string(types.UID(rand.String(16))), owner: t.owner,
		labels: t.template.Labels, annotations: t.template.Annotations, spec: *t.template.Spec.DeepCopy(), ports: ports,
		dir: filepath.Join(r.opts.WorkDir, "pods", name), logPath: filepath.Join(r.opts.WorkDir, "logs", name+".log"),
	}
	cfg := podConfig{
		restartPolicy: t.restartPolicy, backoffLimit: t.backoffLimit,
		initialBackoff: r.opts.RestartBackoff, maxBackoff: r.opts.MaxRestartBackoff,
		probeInterval: r.opts.ProbeInterval, maxGrace: r.opts.MaxGracePeriod, output: r.opts.Output,
		onChange: r.poke, logf: func(msg string, kv ...any) { r.opts.Log.Info(msg, kv...) },
	}
	r.opts.Log.Info("starting pod", "pod", name, "owner", t.owner)
	return startPod(r.podCtx, id, cfg, r.res)
}

// allocatePorts gives every container port a free local port, keyed by the
// port's name and by its number.
func allocatePorts(containers []corev1.Container) (map[string]int, error) {
	out := map[string]int{}
	for _, c := range containers {
		for _, p := range c.Ports {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, fmt.Errorf("allocating a local port: %w", err)
			}
			port := l.Addr().(*net.TCPAddr).Port
			_ = l.Close()
			out[strconv.Itoa(int(p.ContainerPort))] = port
			if p.Name != "" {
				out[p.Name] = port
			}
		}
	}
	return out, nil
}

// Pods returns a snapshot of every local pod, sorted by name.
func (r *Runner) Pods() []PodInfo {
	r.mu.Lock()
	var pods []*pod
	for _, d := range r.deployments {
		pods = append(pods, d.pods...)
	}
	for _, j := range r.jobs {
		pods = append(pods, j.pod)
	}
	r.mu.Unlock()
	out := make([]PodInfo, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.snapshot())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PodsOf returns the pods of one owner, such as "Deployment/orders".
func (r *Runner) PodsOf(owner string) []PodInfo {
	var out []PodInfo
	for _, p := range r.Pods() {
		if p.Owner == owner {
			out = append(out, p)
		}
	}
	return out
}
