package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/idempotency-dev/idc-operator/internal/testenv"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// upgradeFromPrevious: the previous release (hack/release/previous),
// rebuilt from its commit (hack/release/build-previous.sh), is installed
// with its own install.yaml and image; consumers run under steady load
// (JetStream -> upsert with 2 replicas; a two-stage pipeline, upsert with
// spec.emit into a second stream appended by a second resource; an append
// consumer autoscaled by KEDA); then this build is applied over it with
// `kubectl apply --server-side -f dist/install.yaml` while the load goes on.
// It asserts and prints: every published id has exactly one effect (0
// doubled, 0 lost), each Deployment rolled at most once, no lock on a live
// inbox held (or waited for) longer than 1 s from the apply until every
// resource is Ready again (pg_locks sampled every 50 ms), the seconds to
// Ready of each, and that the status the old manager wrote decodes strictly
// under this build's types and keeps its inbox identity and window.
//
// It runs first: it leaves this build installed, and the install step that
// follows applies the same dist/install.yaml (a no-op but for its own
// --retention-period patch) and starts the test namespace afresh.
func (s *suite) upgradeFromPrevious(ctx context.Context, t *testing.T) {
	s.upgradeVia(ctx, t, kubectlUpgrade{s})
}

// helmUpgradeFromPrevious is upgradeFromPrevious the Helm way: the
// kubectl-installed manager goes (the CRD stays), the previous release's
// chart is installed, and the upgrade applies this chart's CRD server-side
// (Helm never upgrades crds/, docs/install.md) and then runs `helm
// upgrade`. The release is uninstalled at the end; the install step brings
// the kubectl-installed manager back.
func (s *suite) helmUpgradeFromPrevious(ctx context.Context, t *testing.T) {
	s.upgradeVia(ctx, t, helmUpgrade{s})
}

// upgradePath installs the previous release one way and upgrades it to
// this build the same way.
type upgradePath interface {
	name() string
	installPrevious(ctx context.Context, t *testing.T, prev previousRelease)
	upgrade(ctx context.Context, t *testing.T)
	// manager is the manager Deployment this path installs.
	manager() types.NamespacedName
	done(ctx context.Context, t *testing.T)
}

type kubectlUpgrade struct{ s *suite }

func (k kubectlUpgrade) name() string { return "kubectl" }
func (k kubectlUpgrade) installPrevious(ctx context.Context, t *testing.T, prev previousRelease) {
	t.Helper()
	if err := k.s.c.Install(ctx, filepath.Join(prev.dir, "install.yaml")); err != nil {
		t.Fatal(err)
	}
}
func (k kubectlUpgrade) upgrade(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := k.s.c.Install(ctx, env.install); err != nil {
		t.Fatal(err)
	}
}
func (k kubectlUpgrade) manager() types.NamespacedName {
	return types.NamespacedName{Namespace: localcluster.OperatorNamespace, Name: localcluster.ManagerDeployment}
}
func (k kubectlUpgrade) done(context.Context, *testing.T) {}

type helmUpgrade struct{ s *suite }

func (h helmUpgrade) name() string { return "helm" }
func (h helmUpgrade) installPrevious(ctx context.Context, t *testing.T, prev previousRelease) {
	t.Helper()
	if _, err := h.s.c.KubectlCmd(ctx, "-n", localcluster.OperatorNamespace, "delete", "deployment", localcluster.ManagerDeployment, "--ignore-not-found", "--wait=true"); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: helmNamespace, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	if err := h.s.c.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Logf("helm install %s:\n%s", prev.version, h.s.helm(ctx, t, "install", helmRelease, filepath.Join(prev.dir, "chart"), "-n", helmNamespace,
		"--set", "image.repository=idc-operator", "--set", "image.tag="+prev.version, "--set", "image.pullPolicy=Never", "--wait", "--timeout", "3m"))
}
func (h helmUpgrade) upgrade(ctx context.Context, t *testing.T) {
	t.Helper()
	chart := filepath.Join(testenv.RepoRoot(), "charts", "idc-operator")
	if _, err := h.s.c.KubectlCmd(ctx, "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(chart, "crds")); err != nil {
		t.Fatal(err)
	}
	repo, tag, _ := strings.Cut(env.image, ":")
	h.s.helm(ctx, t, "upgrade", helmRelease, chart, "-n", helmNamespace, "--reuse-values",
		"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--wait", "--timeout", "3m")
}
func (h helmUpgrade) manager() types.NamespacedName {
	return types.NamespacedName{Namespace: helmNamespace, Name: helmManager}
}
func (h helmUpgrade) done(ctx context.Context, t *testing.T) {
	t.Helper()
	h.s.helm(ctx, t, "uninstall", helmRelease, "-n", helmNamespace, "--wait")
}

func (s *suite) upgradeVia(ctx context.Context, t *testing.T, via upgradePath) {
	prev := buildPrevious(ctx, t)
	prevID := readTrimmed(t, filepath.Join(prev.dir, "idc-operator-image.tar.id"))
	if out, err := exec.CommandContext(ctx, filepath.Join(testenv.RepoRoot(), "hack", "node.sh"), "import", filepath.Join(prev.dir, "idc-operator-image.tar")).CombinedOutput(); err != nil {
		t.Fatalf("importing the %s image: %v\n%s", prev.version, err, out)
	}
	s.deleteNamespace(ctx, t, testNamespace)
	start := time.Now()
	via.installPrevious(ctx, t, prev)
	s.waitManagerImage(ctx, t, via.manager(), prevID, "the "+prev.version+" image")
	t.Logf("release %s (commit %s) installed with %s in %s", prev.version, prev.commit[:12], via.name(), time.Since(start).Round(time.Second))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted",
	}}}
	if err := s.c.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}

	w := s.upgradeWorkload(ctx, t, via.name())
	for _, r := range w.resources {
		s.waitRunning(ctx, t, r.idc, prevID)
	}
	w.startLoad(ctx, t)
	// Under load on the old release for a while, so that status has its
	// window, runtime and lag, and the last roll of the old manager is done.
	time.Sleep(15 * time.Second)
	before := map[string]*upgradeSnapshot{}
	for _, r := range w.resources {
		before[r.idc.Name] = s.snapshot(ctx, t, r.idc)
	}
	managerRev := s.revision(ctx, t, via.manager().Namespace, via.manager().Name)

	locks := startLockSampler(ctx, t, w.dsn, "inbox\\_up%")
	t0 := time.Now()
	via.upgrade(ctx, t)
	s.waitManagerImage(ctx, t, via.manager(), env.imageID, "this build's image, after the upgrade")
	readyAfter := map[string]time.Duration{"manager": time.Since(t0)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, r := range w.resources {
		wg.Go(func() {
			d := s.waitUpgraded(ctx, t, r.idc, t0)
			mu.Lock()
			readyAfter[r.idc.Name] = d
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	lock := locks.stop()
	// The load goes on a little after the last resource is back.
	time.Sleep(10 * time.Second)
	published := w.stopLoad(t)

	// Seconds to Ready.
	var ready []string
	for _, name := range sortedKeys(readyAfter) {
		ready = append(ready, fmt.Sprintf("%s=%.1fs", name, readyAfter[name].Seconds()))
	}
	t.Logf("UPGRADE %s %s -> %s ready after the upgrade: %s", via.name(), prev.version, env.version, strings.Join(ready, " "))

	// Rolls per Deployment: how far its revision moved since the apply (a
	// roll back to an older template moves it too), and the ReplicaSets
	// created since.
	var rolls []string
	mgrRolls := s.revision(ctx, t, via.manager().Namespace, via.manager().Name) - managerRev
	rolls = append(rolls, fmt.Sprintf("manager=%d", mgrRolls))
	if mgrRolls > 1 {
		t.Errorf("the manager rolled %d times, want 1", mgrRolls)
	}
	for _, r := range w.resources {
		b := before[r.idc.Name]
		newRS := 0
		for name := range s.replicaSets(ctx, t, testNamespace, r.idc.Name) {
			if !b.replicaSets[name] {
				newRS++
			}
		}
		n := s.revision(ctx, t, testNamespace, r.idc.Name) - b.revision
		rolls = append(rolls, fmt.Sprintf("%s=%d (%d new ReplicaSet)", r.idc.Name, n, newRS))
		if n > 1 || newRS > 1 {
			t.Errorf("%s: the Deployment rolled %d times (%d new ReplicaSets) on the upgrade, want at most 1", r.idc.Name, n, newRS)
		}
	}
	t.Logf("UPGRADE %s rolls per Deployment: %s", via.name(), strings.Join(rolls, " "))

	// The longest inbox lock during the migration.
	t.Logf("UPGRADE %s longest inbox lock from the upgrade to all Ready (%d samples, 50 ms apart): stronger than ROW EXCLUSIVE %s; any mode %s; longest wait %s",
		via.name(), lock.samples, lock.strong, lock.any, lock.wait)
	for what, l := range map[string]lockSeen{"a lock stronger than ROW EXCLUSIVE held": lock.strong, "a lock held": lock.any, "a lock waited for": lock.wait} {
		if l.ms > 1000 {
			t.Errorf("%s for %dms on %s (%s, %q): over 1 s", what, l.ms, l.rel, l.mode, l.query)
		}
	}
	if lock.samples < 20 {
		t.Errorf("only %d lock samples: the sampler did not run", lock.samples)
	}

	// Status written by the old version, read by this one.
	for _, r := range w.resources {
		s.checkStatusCarried(ctx, t, r.idc, before[r.idc.Name])
	}

	// Effects: every published id once.
	for _, r := range w.resources {
		s.waitDrainedIn(ctx, t, w, r)
		v := w.effects(ctx, t, r, published[r.input])
		t.Logf("UPGRADE %s effects %s: published %d (%d unique ids, %d re-sends), effects %d, distinct %d, doubled %d, lost %d",
			via.name(), r.idc.Name, v.sends, v.unique, v.sends-v.unique, v.rows, v.distinct, v.doubled, v.lost)
		if v.doubled != 0 || v.lost != 0 || v.rows != v.unique || v.unique == 0 {
			t.Errorf("%s: %+v, want one effect per unique id", r.idc.Name, v)
		}
	}

	// Nothing of this step is left for the later ones but this build's
	// operator: the resources go with the namespace (the install step
	// deletes it again, and finds it gone).
	for _, r := range w.resources {
		_ = s.c.Client.Delete(ctx, r.idc)
	}
	s.deleteNamespace(ctx, t, testNamespace)
	via.done(ctx, t)
}

// waitManagerImage waits until the manager Deployment has exactly one pod,
// ready and running the image imageID, and no other pod, not even a
// terminating one (a rollout is complete once the old ReplicaSet is scaled
// down, a moment before its pod is gone). Failing, it says what the
// Deployment and its pods were doing.
func (s *suite) waitManagerImage(ctx context.Context, t *testing.T, mgr types.NamespacedName, imageID, what string) {
	t.Helper()
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		var d appsv1.Deployment
		if err := s.c.Client.Get(ctx, mgr, &d); err != nil {
			return err
		}
		pods, err := s.c.Pods(ctx, mgr.Namespace, d.Spec.Selector.MatchLabels)
		if err != nil {
			return err
		}
		if len(pods) != 1 || pods[0].DeletionTimestamp != nil || !localcluster.PodReady(&pods[0]) ||
			pods[0].Status.ContainerStatuses[0].ImageID != imageID {
			return fmt.Errorf("want one ready pod on %s (%s); deployment %s generation %d (observed %d) replicas %d updated %d ready %d; pods:%s",
				what, imageID, mgr, d.Generation, d.Status.ObservedGeneration, d.Status.Replicas, d.Status.UpdatedReplicas, d.Status.ReadyReplicas, localcluster.DescribePods(pods))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

type previousRelease struct{ dir, version, commit string }

// buildPrevious rebuilds the previous release from its recorded commit
// (reused when bin/previous holds that commit's build).
func buildPrevious(ctx context.Context, t *testing.T) previousRelease {
	t.Helper()
	root := testenv.RepoRoot()
	start := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "release", "build-previous.sh"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/release/build-previous.sh: %v\n%s", err, errOut.String())
	}
	p := previousRelease{dir: strings.TrimSpace(out.String())}
	rec := readTrimmed(t, filepath.Join(root, "hack", "release", "previous"))
	for _, line := range strings.Split(rec, "\n") {
		if v, ok := strings.CutPrefix(line, "version="); ok {
			p.version = v
		}
		if v, ok := strings.CutPrefix(line, "commit="); ok {
			p.commit = v
		}
	}
	if got := readTrimmed(t, filepath.Join(p.dir, "commit")); got != p.commit || p.version == "" {
		t.Fatalf("the previous release in %s is of commit %s, want %s (version %q)", p.dir, got, p.commit, p.version)
	}
	if p.version == env.version {
		t.Fatalf("the previous release is %s, the version of this build too: bump the Makefile's VERSION after a release", p.version)
	}
	t.Logf("previous release %s from commit %s: %s (%s)", p.version, p.commit[:12], p.dir, time.Since(start).Round(time.Second))
	return p
}

func readTrimmed(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
