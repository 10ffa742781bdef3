package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
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
	// managerImageID waits for the one ready manager pod and returns its
	// image ID; managerRevision is its Deployment's revision.
	managerImageID(ctx context.Context, t *testing.T) string
	managerRevision(ctx context.Context, t *testing.T) int
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
func (k kubectlUpgrade) managerImageID(ctx context.Context, t *testing.T) string {
	return k.s.managerPod(ctx, t).Status.ContainerStatuses[0].ImageID
}
func (k kubectlUpgrade) managerRevision(ctx context.Context, t *testing.T) int {
	return k.s.revision(ctx, t, localcluster.OperatorNamespace, localcluster.ManagerDeployment)
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
func (h helmUpgrade) managerImageID(ctx context.Context, t *testing.T) string {
	return h.s.helmManagerPods(ctx, t, 1)[0].Status.ContainerStatuses[0].ImageID
}
func (h helmUpgrade) managerRevision(ctx context.Context, t *testing.T) int {
	return h.s.revision(ctx, t, helmNamespace, helmManager)
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
	if id := via.managerImageID(ctx, t); id != prevID {
		t.Fatalf("the manager runs image %s, not the %s image %s", id, prev.version, prevID)
	}
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
	managerRev := via.managerRevision(ctx, t)

	locks := startLockSampler(ctx, t, w.dsn, "inbox\\_up%")
	t0 := time.Now()
	via.upgrade(ctx, t)
	if id := via.managerImageID(ctx, t); id != env.imageID {
		t.Fatalf("after the upgrade the manager runs %s, want this build's image %s", id, env.imageID)
	}
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
	mgrRolls := via.managerRevision(ctx, t) - managerRev
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
		s.waitDrainedIn(ctx, t, r)
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

// upgradeResource is one consumer of the step, fed from input.
type upgradeResource struct {
	idc   *messagingv1alpha1.IdempotentConsumer
	input string // the load stream it (or its pipeline's first stage) reads
	// effects is the query of (id, count) pairs of its effects; stream and
	// consumer are its own broker position.
	effects          string
	js               jetstream.JetStream
	stream, consumer string
}

type upgradeWorkload struct {
	dsn       string
	resources []*upgradeResource
	inputs    map[string]*loadInput
	stopCh    chan struct{}
	wg        sync.WaitGroup
}

// loadInput is one published stream: what the load sent there.
type loadInput struct {
	js      jetstream.JetStream
	subject string
	mu      sync.Mutex
	sent    map[string]int // id -> times published
	err     error
}

func (s *suite) upgradeWorkload(ctx context.Context, t *testing.T, via string) *upgradeWorkload {
	t.Helper()
	db := s.dbName() + "_upgrade_" + via
	dsn, err := localcluster.RecreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() {
		if !s.parent.Failed() {
			_ = localcluster.DropDatabase(context.Background(), db)
		}
	})
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	// Upsert targets log every row they really write (a trigger): an
	// effect applied twice is a second log row even where the upsert
	// itself would hide it.
	for _, q := range []string{
		"CREATE SCHEMA e2e",
		"CREATE TABLE e2e.effect_log (target text NOT NULL, id text NOT NULL)",
		`CREATE FUNCTION e2e.log_effect() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN INSERT INTO e2e.effect_log VALUES (TG_TABLE_NAME, NEW.order_id); RETURN NEW; END $$`,
		"CREATE TABLE e2e.up_orders (order_id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)",
		"CREATE TRIGGER log AFTER INSERT OR UPDATE ON e2e.up_orders FOR EACH ROW EXECUTE FUNCTION e2e.log_effect()",
		"CREATE TABLE e2e.up_pipe_orders (order_id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)",
		"CREATE TRIGGER log AFTER INSERT OR UPDATE ON e2e.up_pipe_orders FOR EACH ROW EXECUTE FUNCTION e2e.log_effect()",
		"CREATE TABLE e2e.up_pipe_events (event_id text NOT NULL, num int NOT NULL)",
		"CREATE TABLE e2e.up_scaled (event_id text NOT NULL, num int NOT NULL)",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s.secret(ctx, t, "upgrade-db", map[string]string{"dsn": localcluster.PodDSN(dsn)})

	nc, js, err := localcluster.ConnectJetStream()
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(nc.Close)
	scaleJS := s.scaleNATS(ctx, t)
	up := strings.ToUpper(via + "_" + s.suffix)
	streams := []struct {
		js              jetstream.JetStream
		stream, subject string
	}{
		{js, "IDC_UP_ORDERS_" + up, "idc-up-" + via + "-" + s.suffix + ".orders"},
		{js, "IDC_UP_PIPE_IN_" + up, "idc-up-" + via + "-" + s.suffix + ".pipe-in"},
		{js, "IDC_UP_PIPE_MID_" + up, "idc-up-" + via + "-" + s.suffix + ".pipe-mid"},
		{scaleJS, "IDC_UP_SCALED_" + up, "idc-up-" + via + "-" + s.suffix + ".scaled"},
	}
	for _, st := range streams {
		if _, err := st.js.CreateStream(ctx, jetstream.StreamConfig{Name: st.stream, Subjects: []string{st.subject}, MaxAge: time.Hour,
			Duplicates: localcluster.StreamDuplicateWindow}); err != nil {
			t.Fatal(err)
		}
		s.parent.Cleanup(func() { _ = st.js.DeleteStream(context.Background(), st.stream) })
	}
	w := &upgradeWorkload{dsn: dsn, inputs: map[string]*loadInput{}, stopCh: make(chan struct{})}
	for _, i := range []int{0, 1, 3} {
		w.inputs[streams[i].stream] = &loadInput{js: streams[i].js, subject: streams[i].subject, sent: map[string]int{}}
	}
	upsert := func(name, table, stream, extra string, replicas int) string {
		return fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: %[1]s}
spec:
  source:
    natsJetStream: {url: %[2]q, stream: %[3]s, consumer: %[1]s}
  message:
    id: {header: Nats-Msg-Id}
    entity: {key: {jsonPath: $.orderId}, sequence: {jsonPath: $.version}}
  sink:
    postgres: {connectionSecretRef: {name: upgrade-db, key: dsn}, schema: e2e}
    inbox: {table: inbox_%[4]s}
    effect:
      upsert: {table: %[4]s, key: [order_id], columns: {order_id: $.orderId, status: $.status, version: $.version}}
%[5]s  delivery: {batchSize: 50, maxWait: 100ms}
  retention: {maxReplayAge: 48h}
  runtime: {replicas: %[6]d}
`, name, localcluster.PodNATSURL, stream, table, extra, replicas)
	}
	orders := s.apply(ctx, t, upsert("up-orders", "up_orders", streams[0].stream, "", 2))
	pipeA := s.apply(ctx, t, upsert("up-pipe-a", "up_pipe_orders", streams[1].stream, fmt.Sprintf(`  emit:
    natsJetStream: {url: %q, subject: %s}
    payload: {orderId: $.orderId, version: $.version, sourceId: "@messageId"}
`, localcluster.PodNATSURL, streams[2].subject), 1))
	pipeB := s.apply(ctx, t, fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: up-pipe-b}
spec:
  source:
    natsJetStream: {url: %q, stream: %s, consumer: up-pipe-b}
  message:
    id: {header: Nats-Msg-Id}
  sink:
    postgres: {connectionSecretRef: {name: upgrade-db, key: dsn}, schema: e2e}
    inbox: {table: inbox_up_pipe_events}
    effect:
      append: {table: up_pipe_events, columns: {event_id: $.sourceId, num: $.version}}
  delivery: {batchSize: 50, maxWait: 100ms}
  retention: {maxReplayAge: 48h}
`, localcluster.PodNATSURL, streams[2].stream))
	scaled := s.apply(ctx, t, fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: up-scaled}
spec:
  source:
    natsJetStream: {url: "nats://%[1]s:%[2]d", stream: %[3]s, consumer: up-scaled}
  message:
    id: {header: Nats-Msg-Id}
  sink:
    postgres: {connectionSecretRef: {name: upgrade-db, key: dsn}, schema: e2e}
    inbox: {table: inbox_up_scaled}
    effect:
      append: {table: up_scaled, columns: {event_id: "@messageId", num: $.version}}
  delivery: {batchSize: 50, maxWait: 100ms}
  retention: {maxReplayAge: 48h}
  runtime:
    autoscaling: {minReplicas: 1, maxReplicas: 2, lagPerReplica: 500, pollingInterval: 2s, cooldownPeriod: 10s,
      natsMonitoringURL: "http://%[1]s:%[4]d", natsAccount: $G}
`, localcluster.BridgeIP, scaleNATSPort, streams[3].stream, scaleMonitorPort))
	logged := func(table string) string {
		return fmt.Sprintf("SELECT id, count(*) FROM e2e.effect_log WHERE target = '%s' GROUP BY id", table)
	}
	appended := func(table string) string {
		return fmt.Sprintf("SELECT event_id, count(*) FROM e2e.%s GROUP BY event_id", table)
	}
	w.resources = []*upgradeResource{
		{idc: orders, input: streams[0].stream, effects: logged("up_orders"), js: js, stream: streams[0].stream, consumer: "up-orders"},
		{idc: pipeA, input: streams[1].stream, effects: logged("up_pipe_orders"), js: js, stream: streams[1].stream, consumer: "up-pipe-a"},
		{idc: pipeB, input: streams[1].stream, effects: appended("up_pipe_events"), js: js, stream: streams[2].stream, consumer: "up-pipe-b"},
		{idc: scaled, input: streams[3].stream, effects: appended("up_scaled"), js: scaleJS, stream: streams[3].stream, consumer: "up-scaled"},
	}
	return w
}

// startLoad publishes to every input at a steady 100 messages a second
// each (one in ten re-sent once, 300 ms later) until stopLoad.
func (w *upgradeWorkload) startLoad(ctx context.Context, t *testing.T) {
	t.Helper()
	for stream, in := range w.inputs {
		w.wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-w.stopCh:
					return
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				name := func(i int) string { return fmt.Sprintf("%s-%06d", strings.ToLower(stream), i) }
				ids := []string{name(i)}
				if i%10 == 0 && i >= 30 {
					// Past the stream's duplicate window: the consumer
					// gets it again and the inbox must catch it.
					ids = append(ids, name(i-30))
				}
				for _, id := range ids {
					msg := nats.NewMsg(in.subject)
					msg.Header.Set("Nats-Msg-Id", id)
					msg.Data = fmt.Appendf(nil, `{"orderId":%q,"status":"placed","version":1}`, id)
					pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					_, err := in.js.PublishMsg(pctx, msg)
					cancel()
					in.mu.Lock()
					if err != nil && in.err == nil {
						in.err = fmt.Errorf("publishing %s to %s: %w", id, stream, err)
					}
					if err == nil {
						in.sent[id]++
					}
					in.mu.Unlock()
				}
			}
		})
	}
}

// stopLoad ends the load and returns, per input stream, how often each id
// was published.
func (w *upgradeWorkload) stopLoad(t *testing.T) map[string]map[string]int {
	t.Helper()
	close(w.stopCh)
	w.wg.Wait()
	out := map[string]map[string]int{}
	for stream, in := range w.inputs {
		if in.err != nil {
			t.Fatal(in.err)
		}
		out[stream] = in.sent
	}
	return out
}

type upgradeTally struct{ sends, unique, rows, distinct, doubled, lost int }

func (w *upgradeWorkload) effects(ctx context.Context, t *testing.T, r *upgradeResource, sent map[string]int) upgradeTally {
	t.Helper()
	conn, err := pgx.Connect(ctx, w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(ctx, r.effects)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		seen[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	v := upgradeTally{unique: len(sent), distinct: len(seen)}
	for id, n := range sent {
		v.sends += n
		switch m := seen[id]; {
		case m == 0:
			v.lost++
		case m > 1:
			v.doubled++
		}
	}
	for _, n := range seen {
		v.rows += n
	}
	return v
}

// waitDrainedIn waits until the resource's own broker consumer has nothing
// pending or unacknowledged.
func (s *suite) waitDrainedIn(ctx context.Context, t *testing.T, r *upgradeResource) {
	t.Helper()
	dctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := localcluster.WaitDrained(dctx, r.js, r.stream, r.consumer, nil); err != nil {
		t.Fatalf("%s: %v", r.idc.Name, err)
	}
}

// waitRunning waits for Ready and for every pod of the resource to run
// imageID.
func (s *suite) waitRunning(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer, imageID string) {
	t.Helper()
	if _, err := s.upgraded(ctx, idc, imageID, 4*time.Minute); err != nil {
		t.Fatalf("%s: %v", idc.Name, err)
	}
}

// waitUpgraded returns how long after t0 the resource was Ready at its
// generation with its Deployment rolled out on this build's image.
func (s *suite) waitUpgraded(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer, t0 time.Time) time.Duration {
	t.Helper()
	if _, err := s.upgraded(ctx, idc, env.imageID, 5*time.Minute); err != nil {
		t.Errorf("%s after the upgrade: %v", idc.Name, err)
		return 0
	}
	return time.Since(t0)
}

func (s *suite) upgraded(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, imageID string, within time.Duration) (*messagingv1alpha1.IdempotentConsumer, error) {
	var got messagingv1alpha1.IdempotentConsumer
	err := localcluster.Eventually(ctx, within, func() error {
		if err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(idc), &got); err != nil {
			return err
		}
		if !localcluster.IsReady(&got) {
			return fmt.Errorf("not Ready: %s", localcluster.RenderConditions(&got))
		}
		var d appsv1.Deployment
		if err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(idc), &d); err != nil {
			return err
		}
		want := ptr.Deref(d.Spec.Replicas, 1)
		if d.Status.ObservedGeneration != d.Generation || d.Status.UpdatedReplicas != want || d.Status.ReadyReplicas != want || d.Status.Replicas != want {
			return fmt.Errorf("deployment not rolled out: %+v", d.Status)
		}
		pods, err := s.c.ConsumerPods(ctx, idc)
		if err != nil {
			return err
		}
		if len(pods) != int(want) {
			return fmt.Errorf("%d pods, want %d", len(pods), want)
		}
		for _, p := range pods {
			if !localcluster.PodReady(&p) || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].ImageID != imageID {
				return fmt.Errorf("pod %s not ready on image %s:%s", p.Name, imageID, localcluster.DescribePods(pods))
			}
		}
		return nil
	})
	return &got, err
}

// upgradeSnapshot is what the old release left: its status as stored
// (strictly decoded into this build's types) and the Deployment's
// ReplicaSets.
type upgradeSnapshot struct {
	status      messagingv1alpha1.IdempotentConsumerStatus
	replicaSets map[string]bool
	revision    int
}

func (s *suite) snapshot(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer) *upgradeSnapshot {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(messagingv1alpha1.GroupVersion.WithKind("IdempotentConsumer"))
	if err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(idc), u); err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(u.Object["status"])
	if err != nil {
		t.Fatal(err)
	}
	snap := &upgradeSnapshot{replicaSets: s.replicaSets(ctx, t, testNamespace, idc.Name)}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&snap.status); err != nil {
		t.Fatalf("%s: the status the previous release wrote does not decode strictly under this build: %v\n%s", idc.Name, err, raw)
	}
	if snap.status.Inbox == nil || snap.status.Inbox.Epoch == "" || snap.status.Retention == nil || snap.status.Retention.Window == "" || snap.status.Runtime == nil {
		t.Fatalf("%s: the previous release's status lacks inbox, retention or runtime: %s", idc.Name, raw)
	}
	snap.revision = s.revision(ctx, t, testNamespace, idc.Name)
	return snap
}

// checkStatusCarried: this build reads the old status and keeps what it
// says of the inbox (table, layout, schema, epoch: the same generation of
// dedup state, not a new or lost one) and of the window.
func (s *suite) checkStatusCarried(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer, b *upgradeSnapshot) {
	t.Helper()
	now := s.get(ctx, t, idc).Status
	old := b.status
	if now.Inbox == nil || *now.Inbox != *old.Inbox {
		t.Errorf("%s: status.inbox %+v after the upgrade, was %+v", idc.Name, now.Inbox, old.Inbox)
	}
	// The window itself stays; its inputs may move on (a broker consumer the
	// old status saw as "does not exist yet" exists by now).
	if now.Retention == nil || now.Retention.Window != old.Retention.Window || now.Retention.Source != old.Retention.Source {
		t.Errorf("%s: status.retention %+v after the upgrade, was %+v", idc.Name, now.Retention, old.Retention)
	}
	if now.Guarantee != old.Guarantee || now.Runtime == nil || now.Runtime.Deployment != old.Runtime.Deployment {
		t.Errorf("%s: guarantee %q runtime %+v after the upgrade, was %q %+v", idc.Name, now.Guarantee, now.Runtime, old.Guarantee, old.Runtime)
	}
	if idc.Spec.Runtime.Autoscaling != nil {
		if c := localcluster.Condition(s.get(ctx, t, idc), messagingv1alpha1.ConditionAutoscaling); c != "True/"+messagingv1alpha1.ReasonScaledByKEDA {
			t.Errorf("%s: Autoscaling %s after the upgrade, want True/ScaledByKEDA", idc.Name, c)
		}
	}
	t.Logf("UPGRADE status %s carried: inbox %s epoch %s schema %d, window %s (%s), guarantee %s", idc.Name,
		now.Inbox.Table, now.Inbox.Epoch, now.Inbox.SchemaVersion, now.Retention.Window, now.Retention.Source, now.Guarantee)
}

// revision is the Deployment's deployment.kubernetes.io/revision.
func (s *suite) revision(ctx context.Context, t *testing.T, namespace, name string) int {
	t.Helper()
	var d appsv1.Deployment
	if err := s.c.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &d); err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(d.Annotations["deployment.kubernetes.io/revision"])
	if err != nil {
		t.Fatalf("deployment %s/%s: revision %q: %v", namespace, name, d.Annotations["deployment.kubernetes.io/revision"], err)
	}
	return n
}

// replicaSets names the ReplicaSets a Deployment owns.
func (s *suite) replicaSets(ctx context.Context, t *testing.T, namespace, deployment string) map[string]bool {
	t.Helper()
	var list appsv1.ReplicaSetList
	if err := s.c.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, rs := range list.Items {
		for _, o := range rs.OwnerReferences {
			if o.Kind == "Deployment" && o.Name == deployment {
				out[rs.Name] = true
			}
		}
	}
	return out
}

// lockSeen is the longest of one kind of inbox lock the sampler saw.
type lockSeen struct {
	ms               int64
	mode, rel, query string
}

type lockSummary struct {
	strong, any, wait lockSeen
	samples           int
}

type lockSampler struct {
	stopCh chan struct{}
	done   chan lockSummary
}

// startLockSampler samples pg_locks joined with pg_stat_activity every 50 ms
// for the relation locks on the tables matching pattern (the inboxes and
// their side tables) in the database of dsn. A held lock's age is its
// transaction's (the lock is held since at most then); a waiting one's is
// its statement's.
func startLockSampler(ctx context.Context, t *testing.T, dsn, pattern string) *lockSampler {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	ls := &lockSampler{stopCh: make(chan struct{}), done: make(chan lockSummary, 1)}
	const q = `SELECT l.mode, l.granted, c.relname, left(coalesce(a.query, ''), 100),
		(extract(epoch FROM clock_timestamp() - CASE WHEN l.granted THEN coalesce(a.xact_start, a.query_start) ELSE a.query_start END) * 1000)::bigint
		FROM pg_locks l JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND n.nspname = 'e2e' AND c.relname LIKE $1 AND a.pid <> pg_backend_pid()`
	go func() {
		defer func() { _ = conn.Close(context.Background()) }()
		var sum lockSummary
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ls.stopCh:
				ls.done <- sum
				return
			case <-ctx.Done():
				ls.done <- sum
				return
			case <-tick.C:
			}
			rows, err := conn.Query(ctx, q, pattern)
			if err != nil {
				continue
			}
			for rows.Next() {
				var l lockSeen
				var granted bool
				if rows.Scan(&l.mode, &granted, &l.rel, &l.query, &l.ms) != nil {
					continue
				}
				weak := l.mode == "AccessShareLock" || l.mode == "RowShareLock" || l.mode == "RowExclusiveLock"
				switch {
				case !granted:
					sum.wait = longer(sum.wait, l)
				case !weak:
					sum.strong = longer(sum.strong, l)
				}
				if granted {
					sum.any = longer(sum.any, l)
				}
			}
			rows.Close()
			sum.samples++
		}
	}()
	return ls
}

func (l lockSeen) String() string {
	if l.mode == "" {
		return "none seen"
	}
	return fmt.Sprintf("%dms (%s on %s, %q)", l.ms, l.mode, l.rel, l.query)
}

func longer(a, b lockSeen) lockSeen {
	if b.ms > a.ms {
		return b
	}
	return a
}

func (ls *lockSampler) stop() lockSummary {
	close(ls.stopCh)
	return <-ls.done
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
