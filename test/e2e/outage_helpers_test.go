package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// waitNoPods waits until the Deployment is at 0 replicas and the kubelet
// stopped every pod.
func (s *suite) waitNoPods(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer) {
	t.Helper()
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		d := s.deployment(ctx, t, idc)
		if ptr.Deref(d.Spec.Replicas, 1) != 0 || d.Status.Replicas != 0 {
			return fmt.Errorf("deployment replicas spec=%d status=%d", ptr.Deref(d.Spec.Replicas, 1), d.Status.Replicas)
		}
		pods, err := s.c.Pods(ctx, testNamespace, d.Spec.Selector.MatchLabels)
		if err != nil {
			return err
		}
		if len(pods) != 0 {
			return fmt.Errorf("pods left:%s", localcluster.DescribePods(pods))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// logProgress logs the replicas' progress rows, as the prune job reads them.
func (s *suite) logProgress(ctx context.Context, t *testing.T) {
	t.Helper()
	conn, err := pgx.Connect(ctx, s.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(ctx, `SELECT replica, round(extract(epoch FROM now() - heartbeat_at)), 
		coalesce(round(extract(epoch FROM now() - unacked_since))::text, '-'), stopped, positions::text
		FROM e2e.`+outageInbox+`_progress ORDER BY heartbeat_at`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var replica, unacked, positions string
		var silent float64
		var stopped bool
		if err := rows.Scan(&replica, &silent, &unacked, &stopped, &positions); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "\n  %s silent=%.0fs unackedFor=%ss stopped=%t positions=%s", replica, silent, unacked, stopped, positions)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("progress rows before the prune run:%s", b.String())
}

func (s *suite) consumerInfo(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(ctx, stream, outageName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func jsFacts(info *jetstream.ConsumerInfo) string {
	if info == nil {
		return "no consumer info"
	}
	return fmt.Sprintf("delivered=%d ackFloor=%d ackPending=%d redelivered=%d pending=%d",
		info.Delivered.Stream, info.AckFloor.Stream, info.NumAckPending, info.NumRedelivered, info.NumPending)
}

// count is the number of rows of an e2e table.
func (s *suite) count(ctx context.Context, t *testing.T, table string) int {
	t.Helper()
	conn, err := pgx.Connect(ctx, s.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{"e2e", table}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (s *suite) exec(ctx context.Context, t *testing.T, stmt string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, s.dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

func deploymentTemplate(d *appsv1.Deployment) *corev1.Pod {
	return &corev1.Pod{Spec: d.Spec.Template.Spec}
}

// hasFailpoint says whether the pod's runtime container has the failpoint
// armed.
func hasFailpoint(p *corev1.Pod) bool {
	for _, c := range p.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == failpointEnvVar && e.Value == failpointValue {
				return true
			}
		}
	}
	return false
}

// killedBySIGKILL says whether the pod's container restarted or was
// terminated by SIGKILL (exit code 137), and how.
func killedBySIGKILL(p *corev1.Pod) (string, bool) {
	for _, cs := range p.Status.ContainerStatuses {
		if term := cs.State.Terminated; term != nil && term.ExitCode == 137 {
			return fmt.Sprintf("container %s terminated: exit %d %s, restarts %d", cs.Name, term.ExitCode, term.Reason, cs.RestartCount), true
		}
		if cs.RestartCount >= 1 {
			how := ""
			if last := cs.LastTerminationState.Terminated; last != nil {
				how = fmt.Sprintf(": last exit %d %s", last.ExitCode, last.Reason)
			}
			return fmt.Sprintf("container %s restarted %d times%s", cs.Name, cs.RestartCount, how), true
		}
	}
	return "", false
}

// num reads a JSON number of a log line.
func num(v any) float64 {
	f, _ := v.(float64)
	return f
}
