package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/gitopshealth"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// promInterval is the test Prometheus's scrape and evaluation interval.
const promInterval = 2 * time.Second

// sinkAlertFor is the for: of IdcSinkMisconfigured in rules.yaml (checked
// against the file below).
const sinkAlertFor = 2 * time.Minute

// shippedAlertsPage: the PrometheusRule config/prometheus/rules.yaml, loaded
// as it ships into a real Prometheus (Debian's prometheus 2.42, a process of
// the test on loopback) that scrapes the manager's /metrics through its
// Service, pages for a revoked grant while the consumer Deployment is at 0
// replicas and no pod exports anything; the Argo CD health check and kstatus
// read the live resource as Degraded/Failed meanwhile. Granting it back
// makes the resource Ready within 30 s, Healthy/Current, and the alert
// resolves.
func (s *suite) shippedAlertsPage(ctx context.Context, t *testing.T) {
	name := "alerts-" + s.suffix
	role, dsn := s.alertsDatabase(ctx, t, name)
	s.secret(ctx, t, name+"-db", map[string]string{"dsn": dsn})
	stream := s.alertsStream(ctx, t, name)
	prom := startPrometheus(ctx, t, s.managerScrapeTarget(ctx, t))

	idc := s.apply(ctx, t, fmt.Sprintf(`
apiVersion: messaging.idempotency.dev/v1alpha1
kind: IdempotentConsumer
metadata: {name: %s}
spec:
  source:
    natsJetStream: {url: %q, stream: %s, consumer: %s}
  message:
    id: {jsonPath: $.eventId}
  sink:
    postgres: {connectionSecretRef: {name: %s-db, key: dsn}, schema: e2e}
    inbox: {table: inbox_alerts}
    effect:
      append: {table: alert_events, columns: {event_id: "@messageId", num: $.n}}
  retention: {maxReplayAge: 48h}
  runtime: {replicas: 1}
`, name, localcluster.PodNATSURL, stream, name, name))
	t.Cleanup(func() { _ = s.c.Client.Delete(context.Background(), idc) })
	s.waitReady(ctx, t, idc, 1)
	// The manager's state metrics reach Prometheus.
	if err := localcluster.Eventually(ctx, time.Minute, func() error {
		return prom.expectSeries(ctx, fmt.Sprintf(`idc_resource_condition{name=%q,condition="Ready",status="True"}`, name))
	}); err != nil {
		t.Fatal(err)
	}
	health := newHealthReader(t)

	// Revoke the runtime's privilege on the effect table.
	s.alertsExec(ctx, t, name, fmt.Sprintf("REVOKE INSERT ON e2e.alert_events FROM %s", pgx.Identifier{role}.Sanitize()))
	revoked := time.Now()

	// The controller holds the Deployment at 0: no pod exports anything.
	if err := localcluster.Eventually(ctx, time.Minute, func() error {
		d := s.deployment(ctx, t, idc)
		pods, err := s.c.ConsumerPods(ctx, idc)
		if err != nil {
			return err
		}
		if ptr.Deref(d.Spec.Replicas, -1) != 0 || len(pods) != 0 {
			return fmt.Errorf("Deployment replicas %d, %d pods", ptr.Deref(d.Spec.Replicas, -1), len(pods))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("Deployment at 0 replicas, no consumer pod, %s after the REVOKE", time.Since(revoked).Round(100*time.Millisecond))
	got := s.get(ctx, t, idc)
	if c := localcluster.Condition(got, messagingv1alpha1.ConditionStalled); c != "True/"+messagingv1alpha1.ReasonPermissionDenied {
		t.Fatalf("Stalled = %s, want True/PermissionDenied", c)
	}
	health.expect(ctx, t, s, idc, "Degraded", "Failed")

	// The alert goes pending, then fires within its for: plus one
	// evaluation. Judged on Prometheus's own evaluations (the ALERTS
	// samples each one writes, and the iterations it missed): a host too
	// busy to evaluate on time (2 cores shared by several engineers) delays
	// the evaluations, not the rule's verdict.
	alert := prom.waitAlert(ctx, t, "IdcSinkMisconfigured", name, "firing", sinkAlertFor+4*time.Minute)
	if alert.Labels["reason"] != messagingv1alpha1.ReasonPermissionDenied {
		t.Fatalf("alert reason %q, want PermissionDenied", alert.Labels["reason"])
	}
	// Samples carry the evaluation's time in milliseconds; activeAt is the
	// same time with nanoseconds.
	alert.ActiveAt = alert.ActiveAt.Truncate(time.Millisecond)
	lastPending, firstFiring := prom.alertEvaluations(ctx, t, "IdcSinkMisconfigured", name, alert.ActiveAt)
	missed := prom.missedEvaluations(ctx, t)
	t.Logf("IdcSinkMisconfigured{reason=%s} pending at %s (%s after the REVOKE); last pending evaluation +%s, first firing evaluation +%s (for: %s, evaluation every %s, %g evaluations missed); seen firing +%s",
		alert.Labels["reason"], alert.ActiveAt.Format(time.RFC3339), alert.ActiveAt.Sub(revoked).Round(100*time.Millisecond),
		lastPending.Sub(alert.ActiveAt), firstFiring.Sub(alert.ActiveAt), sinkAlertFor, promInterval, missed, alert.seenAt.Sub(alert.ActiveAt).Round(100*time.Millisecond))
	// It fired at the first evaluation once for: had passed...
	if !lastPending.Before(alert.ActiveAt.Add(sinkAlertFor)) || firstFiring.Before(alert.ActiveAt.Add(sinkAlertFor)) {
		t.Fatalf("pending until +%s, firing from +%s: want firing from the first evaluation at or after for: (%s)",
			lastPending.Sub(alert.ActiveAt), firstFiring.Sub(alert.ActiveAt), sinkAlertFor)
	}
	// ...which came within one evaluation interval (plus those Prometheus
	// reports it missed).
	if limit := sinkAlertFor + promInterval*time.Duration(1+missed) + time.Second; firstFiring.Sub(alert.ActiveAt) > limit {
		t.Fatalf("fired %s after going pending; want within for: + one evaluation (%s)", firstFiring.Sub(alert.ActiveAt), limit)
	}
	if d := s.deployment(ctx, t, idc); ptr.Deref(d.Spec.Replicas, -1) != 0 || d.Status.Replicas != 0 {
		t.Fatalf("while the alert fires the Deployment has %d/%d replicas, want 0", ptr.Deref(d.Spec.Replicas, -1), d.Status.Replicas)
	}
	health.expect(ctx, t, s, idc, "Degraded", "Failed")

	// Grant it back: Ready within 30 s, nobody touching the resource.
	s.alertsExec(ctx, t, name, fmt.Sprintf("GRANT INSERT ON e2e.alert_events TO %s", pgx.Identifier{role}.Sanitize()))
	granted := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := localcluster.WaitFor(wctx, s.c.Client, client.ObjectKeyFromObject(idc), localcluster.IsReady, nil); err != nil {
		t.Fatalf("not Ready within 30 s of the GRANT: %v", err)
	}
	t.Logf("Ready %s after the GRANT", time.Since(granted).Round(100*time.Millisecond))
	health.expect(ctx, t, s, idc, "Healthy", "Current")
	if err := localcluster.Eventually(ctx, time.Minute, func() error {
		return prom.expectNoAlert(ctx, "IdcSinkMisconfigured", name)
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("IdcSinkMisconfigured resolved %s after the GRANT", time.Since(granted).Round(100*time.Millisecond))
}

// alertsDatabase makes a database for the step, a login role that owns its
// schema e2e (so the inbox is the role's) and may INSERT into the effect
// table, and returns the role and the DSN pods use.
func (s *suite) alertsDatabase(ctx context.Context, t *testing.T, name string) (role, podDSN string) {
	t.Helper()
	db := strings.ReplaceAll(name, "-", "_")
	role = db
	hostDSN, err := localcluster.RecreateDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, localcluster.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	r := pgx.Identifier{role}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE ROLE "+r+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = localcluster.DropDatabase(context.Background(), db)
		if c, err := pgx.Connect(context.Background(), localcluster.AdminDSN()); err == nil {
			_, _ = c.Exec(context.Background(), "DROP ROLE IF EXISTS "+r)
			_ = c.Close(context.Background())
		}
	})
	s.execAs(ctx, t, hostDSN, "CREATE SCHEMA e2e AUTHORIZATION "+r)
	s.execAs(ctx, t, hostDSN, "CREATE TABLE e2e.alert_events (event_id text NOT NULL, num int NOT NULL)")
	s.execAs(ctx, t, hostDSN, "GRANT SELECT, INSERT ON e2e.alert_events TO "+r)
	u, err := url.Parse(localcluster.PodDSN(hostDSN))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return role, u.String()
}

func (s *suite) alertsExec(ctx context.Context, t *testing.T, name, stmt string) {
	t.Helper()
	dsn, err := localcluster.DatabaseDSN(strings.ReplaceAll(name, "-", "_"))
	if err != nil {
		t.Fatal(err)
	}
	s.execAs(ctx, t, dsn, stmt)
}

// execAs runs stmt on dsn.
func (s *suite) execAs(ctx context.Context, t *testing.T, dsn, stmt string) {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, stmt); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

func (s *suite) alertsStream(ctx context.Context, t *testing.T, name string) string {
	t.Helper()
	nc, js, err := localcluster.ConnectJetStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	stream := "IDC_E2E_ALERTS_" + strings.ToUpper(s.suffix)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{strings.ToLower(name) + ".>"}, MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	return stream
}

// scrapeTarget is the manager's metrics endpoint and a token allowed to
// read it (the metrics-scraper ServiceAccount of the metrics step).
type scrapeTarget struct{ address, token string }

func (s *suite) managerScrapeTarget(ctx context.Context, t *testing.T) scrapeTarget {
	t.Helper()
	cs, err := kubernetes.NewForConfig(s.c.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(testNamespace).CreateToken(ctx, "metrics-scraper", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var svc corev1.Service
	if err := s.c.Client.Get(ctx, client.ObjectKey{Namespace: localcluster.OperatorNamespace, Name: "idc-controller-manager-metrics-service"}, &svc); err != nil {
		t.Fatal(err)
	}
	return scrapeTarget{address: net.JoinHostPort(svc.Spec.ClusterIP, "8443"), token: tr.Status.Token}
}

// healthReader reads a live resource through the shipped Argo CD Lua check
// and kstatus.
type healthReader struct{ script string }

func newHealthReader(t *testing.T) *healthReader {
	t.Helper()
	script, err := gitopshealth.Script(filepath.Join(testenv.RepoRoot(), "config", "argocd"))
	if err != nil {
		t.Fatal(err)
	}
	return &healthReader{script: script}
}

func (h *healthReader) expect(ctx context.Context, t *testing.T, s *suite, idc *messagingv1alpha1.IdempotentConsumer, argo, kstatus string) {
	t.Helper()
	var gotArgo, gotKstatus, msg string
	err := localcluster.Eventually(ctx, 30*time.Second, func() error {
		obj := s.liveObject(ctx, t, idc)
		var err error
		if gotArgo, msg, err = gitopshealth.ArgoCD(h.script, obj.Object); err != nil {
			return err
		}
		if gotKstatus, _, err = gitopshealth.Kstatus(obj); err != nil {
			return err
		}
		if gotArgo != argo || gotKstatus != kstatus {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: Argo CD %s %q, kstatus %s; want %s, %s", idc.Name, gotArgo, msg, gotKstatus, argo, kstatus)
	}
	t.Logf("%s: Argo CD %s (%.120s), kstatus %s", idc.Name, gotArgo, msg, gotKstatus)
}
