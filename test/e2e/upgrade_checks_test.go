package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

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
