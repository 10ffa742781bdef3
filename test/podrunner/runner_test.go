package podrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// The test binary doubles as the container program: with FAKE_CONTAINER=1
// in its environment (set by the pod spec) it runs fakeContainer instead of
// the tests.
func TestMain(m *testing.M) {
	if os.Getenv("FAKE_CONTAINER") == "1" {
		os.Exit(fakeContainer(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// report is what a fake container saw.
type report struct {
	Pod    string `json:"pod"`
	Secret string `json:"secret"`
	Config string `json:"config"`
	Addr   string `json:"addr"`
}

// fakeContainer: "serve CONFIG REPORT_DIR" writes a report and serves
// /readyz on $HTTP_ADDR until SIGTERM (exit 0); "exit CODE" exits with CODE.
func fakeContainer(args []string) int {
	if len(args) == 2 && args[0] == "exit" {
		time.Sleep(100 * time.Millisecond)
		code, _ := strconv.Atoi(args[1])
		return code
	}
	if len(args) != 3 || args[0] != "serve" {
		fmt.Fprintln(os.Stderr, "fake container: bad args", args)
		return 2
	}
	cfg, err := os.ReadFile(args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	r := report{Pod: os.Getenv("POD_NAME"), Secret: os.Getenv("SECRET"), Config: string(cfg), Addr: os.Getenv("HTTP_ADDR")}
	b, _ := json.Marshal(r)
	if err := os.WriteFile(filepath.Join(args[2], r.Pod+".json"), b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return serveUntilTerm(r.Addr)
}

func serveUntilTerm(addr string) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	go func() { _ = http.Serve(ln, mux) }() //nolint:gosec // a test helper on loopback
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	return 0
}

type fixture struct {
	t       *testing.T
	ctx     context.Context
	c       client.Client
	runner  *Runner
	reports string
}

func newFixture(t *testing.T) *fixture {
	env, err := testenv.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(cfg, Options{
		Namespace: "default", Commands: map[string]string{"/fake": exe}, WorkDir: t.TempDir(),
		PortEnv: map[string]string{"http": "HTTP_ADDR"}, ProbeInterval: 100 * time.Millisecond,
		RestartBackoff: 100 * time.Millisecond, MaxRestartBackoff: 400 * time.Millisecond, MaxGracePeriod: 5 * time.Second,
		ResyncPeriod: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return &fixture{t: t, ctx: ctx, c: r.c, runner: r, reports: t.TempDir()}
}

func (f *fixture) create(obj client.Object) {
	f.t.Helper()
	if err := f.c.Create(f.ctx, obj); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) eventually(what string, cond func() error) {
	f.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: %v; pods: %+v", what, err, f.runner.Pods())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func fakePodSpec(restart corev1.RestartPolicy, args ...string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "fake"}},
		Spec: corev1.PodSpec{
			RestartPolicy: restart,
			Containers: []corev1.Container{{
				Name: "main", Image: "fake", Command: []string{"/fake"}, Args: args,
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				Env: []corev1.EnvVar{
					{Name: "FAKE_CONTAINER", Value: "1"},
					{Name: "SECRET", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "password"}}},
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				},
				VolumeMounts:   []corev1.VolumeMount{{Name: "cfg", MountPath: "/etc/fake"}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("http")}}},
			}},
			Volumes: []corev1.Volume{{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}},
		},
	}
}

func (f *fixture) deployment(name string) *appsv1.Deployment {
	d := &appsv1.Deployment{}
	if err := f.c.Get(f.ctx, client.ObjectKey{Namespace: "default", Name: name}, d); err != nil {
		f.t.Fatal(err)
	}
	return d
}

func (f *fixture) readyReplicas(name string, want int32) func() error {
	return func() error {
		d := f.deployment(name)
		if d.Status.ReadyReplicas != want || d.Status.Replicas != want || d.Status.ObservedGeneration != d.Generation {
			return fmt.Errorf("status %+v, want %d ready", d.Status, want)
		}
		return nil
	}
}

func TestRunnerWithControlPlane(t *testing.T) {
	f := newFixture(t)
	f.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "default"}, StringData: map[string]string{"password": "s3cret"}})
	f.create(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Namespace: "default"}, Data: map[string]string{"settings.txt": "color=blue"}})
	t.Run("deployment replicas resolve env and volumes and report ready", f.deploymentReady)
	t.Run("scaling and a template change replace the processes", f.scaleAndRoll)
	t.Run("a process that exits is restarted", f.crashRestarts)
	t.Run("jobs succeed or fail after backoffLimit", f.jobs)
	t.Run("a CronJob triggered on demand runs as a Job", f.cronJob)
}

func (f *fixture) deploymentReady(t *testing.T) {
	tmpl := fakePodSpec(corev1.RestartPolicyAlways, "serve", "/etc/fake/settings.txt", f.reports)
	f.create(&appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr.To(int32(2)), Selector: &metav1.LabelSelector{MatchLabels: tmpl.Labels}, Template: tmpl},
	})
	f.eventually("2 ready replicas", f.readyReplicas("web", 2))
	addrs := map[string]bool{}
	for _, p := range f.runner.PodsOf("Deployment/web") {
		b, err := os.ReadFile(filepath.Join(f.reports, p.Name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var r report
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		if r.Secret != "s3cret" || r.Config != "color=blue" || r.Pod != p.Name || r.Addr != p.Addr("http") {
			t.Errorf("pod %s saw %+v", p.Name, r)
		}
		addrs[r.Addr] = true
	}
	if len(addrs) != 2 {
		t.Errorf("replicas share addresses: %v", addrs)
	}
	if c := f.deployment("web").Status.Conditions[0]; c.Type != appsv1.DeploymentAvailable || c.Status != corev1.ConditionTrue {
		t.Errorf("Available = %+v", c)
	}
}

func (f *fixture) scaleAndRoll(t *testing.T) {
	f.update("web", func(d *appsv1.Deployment) { d.Spec.Replicas = ptr.To(int32(1)) })
	f.eventually("1 ready replica", f.readyReplicas("web", 1))
	before := f.runner.PodsOf("Deployment/web")[0].Name
	f.update("web", func(d *appsv1.Deployment) { d.Spec.Template.Annotations = map[string]string{"config-hash": "2"} })
	f.eventually("a new pod", func() error {
		pods := f.runner.PodsOf("Deployment/web")
		if len(pods) != 1 || pods[0].Name == before || !pods[0].Ready {
			return fmt.Errorf("pods %+v", pods)
		}
		return f.readyReplicas("web", 1)()
	})
	f.update("web", func(d *appsv1.Deployment) { d.Spec.Replicas = ptr.To(int32(0)) })
	f.eventually("no pods", f.readyReplicas("web", 0))
}

func (f *fixture) update(name string, mutate func(*appsv1.Deployment)) {
	f.eventually("updating "+name, func() error {
		d := f.deployment(name)
		mutate(d)
		return f.c.Update(f.ctx, d)
	})
}

func (f *fixture) crashRestarts(t *testing.T) {
	tmpl := fakePodSpec(corev1.RestartPolicyAlways, "exit", "1")
	f.create(&appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "crashy", Namespace: "default"},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: tmpl.Labels}, Template: tmpl},
	})
	f.eventually("restarts", func() error {
		pods := f.runner.PodsOf("Deployment/crashy")
		if len(pods) != 1 || pods[0].Restarts < 2 {
			return fmt.Errorf("pods %+v", pods)
		}
		return nil
	})
	if d := f.deployment("crashy"); d.Status.ReadyReplicas != 0 {
		t.Errorf("a crashing pod is reported ready: %+v", d.Status)
	}
}

func (f *fixture) job(name string, backoffLimit int32, args ...string) {
	tmpl := fakePodSpec(corev1.RestartPolicyNever, args...)
	f.create(&batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       batchv1.JobSpec{BackoffLimit: ptr.To(backoffLimit), Template: tmpl},
	})
}

func (f *fixture) jobs(t *testing.T) {
	f.job("ok", 0, "exit", "0")
	f.job("bad", 1, "exit", "3")
	ctx, cancel := context.WithTimeout(f.ctx, time.Minute)
	defer cancel()
	j, err := f.runner.WaitForJob(ctx, "ok")
	if err != nil || j.Status.Succeeded != 1 || j.Status.CompletionTime == nil {
		t.Fatalf("job ok: %v, %+v", err, j.Status)
	}
	j, err = f.runner.WaitForJob(ctx, "bad")
	if err == nil || JobFinished(j) != batchv1.JobFailed || j.Status.Failed != 2 {
		t.Fatalf("job bad: %v, %+v", err, j.Status)
	}
}

func (f *fixture) cronJob(t *testing.T) {
	tmpl := fakePodSpec(corev1.RestartPolicyOnFailure, "exit", "0")
	f.create(&batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "default"},
		Spec: batchv1.CronJobSpec{Schedule: "0 3 * * *", Suspend: ptr.To(true), JobTemplate: batchv1.JobTemplateSpec{
			Spec: batchv1.JobSpec{Template: tmpl},
		}},
	})
	name, err := f.runner.TriggerCronJob(f.ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.ctx, time.Minute)
	defer cancel()
	j, err := f.runner.WaitForJob(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(j); ref == nil || ref.Name != "nightly" {
		t.Errorf("job %s is not owned by the CronJob: %+v", name, j.OwnerReferences)
	}
	if _, err := f.runner.TriggerCronJob(f.ctx, "missing"); err == nil {
		t.Error("triggering a missing CronJob must fail")
	}
}
