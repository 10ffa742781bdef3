package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	"sigs.k8s.io/yaml"

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

// prometheus is a Prometheus server the test runs on loopback.
type prometheus struct {
	base string
	hc   *http.Client
}

// startPrometheus runs Debian's prometheus on 127.0.0.1 with the shipped
// rules (the PrometheusRule's spec, as the Prometheus Operator hands it
// over) evaluated every promInterval, scraping the manager as the
// ServiceMonitor does (HTTPS, a bearer token, honorLabels).
func startPrometheus(ctx context.Context, t *testing.T, target scrapeTarget) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus is required (Debian package prometheus, make promtool): %v", err)
	}
	dir := t.TempDir()
	rules := rulesSpec(t)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("rules.yaml", rules)
	write("token", []byte(target.token))
	addr := freeLoopbackAddr(t)
	cfg := fmt.Sprintf(`global: {scrape_interval: %[1]s, evaluation_interval: %[1]s, scrape_timeout: %[1]s}
rule_files: [rules.yaml]
scrape_configs:
- job_name: idc-manager
  scheme: https
  honor_labels: true
  tls_config: {insecure_skip_verify: true}
  authorization: {credentials_file: token}
  static_configs: [{targets: [%q]}]
`, promInterval, target.address)
	cfgPath := write("prometheus.yml", []byte(cfg))
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("prometheus log:\n%s", b)
		}
	})
	p := &prometheus{base: "http://" + addr, hc: &http.Client{Timeout: 5 * time.Second}}
	if err := localcluster.Eventually(ctx, 30*time.Second, func() error {
		var out struct {
			Data struct {
				ActiveTargets []struct {
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if err := p.getJSON(ctx, "/api/v1/targets", &out); err != nil {
			return err
		}
		if len(out.Data.ActiveTargets) != 1 || out.Data.ActiveTargets[0].Health != "up" {
			return fmt.Errorf("the manager target is not up yet: %+v", out.Data.ActiveTargets)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

// rulesSpec is rules.yaml's spec as a plain Prometheus rules file, with
// IdcSinkMisconfigured's for: checked against sinkAlertFor.
func rulesSpec(t *testing.T) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "prometheus", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert string `json:"alert"`
					For   string `json:"for"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "IdcSinkMisconfigured" {
				found = true
				if d, err := time.ParseDuration(r.For); err != nil || d != sinkAlertFor {
					t.Fatalf("IdcSinkMisconfigured for: %q, the test expects %s", r.For, sinkAlertFor)
				}
			}
		}
	}
	if !found {
		t.Fatal("rules.yaml has no IdcSinkMisconfigured")
	}
	var whole map[string]any
	if err := yaml.Unmarshal(raw, &whole); err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(whole["spec"])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

func (p *prometheus) getJSON(ctx context.Context, path string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

// expectSeries fails unless the instant query returns a series.
func (p *prometheus) expectSeries(ctx context.Context, query string) error {
	var out struct {
		Data struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := p.getJSON(ctx, "/api/v1/query?query="+url.QueryEscape(query), &out); err != nil {
		return err
	}
	if len(out.Data.Result) == 0 {
		return fmt.Errorf("no series for %s", query)
	}
	return nil
}

type promAlert struct {
	Labels   map[string]string `json:"labels"`
	State    string            `json:"state"`
	ActiveAt time.Time         `json:"activeAt"`
	// seenAt is when the test saw the alert in this state.
	seenAt time.Time
}

// alerts is /api/v1/alerts: the pending and firing alerts.
func (p *prometheus) alerts(ctx context.Context, alertname, name string) ([]promAlert, error) {
	var out struct {
		Data struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := p.getJSON(ctx, "/api/v1/alerts", &out); err != nil {
		return nil, err
	}
	var mine []promAlert
	for _, a := range out.Data.Alerts {
		if a.Labels["alertname"] == alertname && a.Labels["name"] == name {
			a.seenAt = time.Now()
			mine = append(mine, a)
		}
	}
	return mine, nil
}

// waitAlert polls /api/v1/alerts every 500 ms until the alert is in state.
func (p *prometheus) waitAlert(ctx context.Context, t *testing.T, alertname, name, state string, timeout time.Duration) promAlert {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last []promAlert
	for {
		got, err := p.alerts(ctx, alertname, name)
		if err == nil {
			last = got
			for _, a := range got {
				if a.State == state {
					return a
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s for %s not %s within %s (last: %+v, err %v)", alertname, name, state, timeout, last, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// alertEvaluations reads the ALERTS samples the rule's evaluations wrote
// since activeAt: the last one pending and the first one firing.
func (p *prometheus) alertEvaluations(ctx context.Context, t *testing.T, alertname, name string, activeAt time.Time) (lastPending, firstFiring time.Time) {
	t.Helper()
	var out struct {
		Data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	q := fmt.Sprintf(`ALERTS{alertname=%q,name=%q}[15m]`, alertname, name)
	if err := p.getJSON(ctx, "/api/v1/query?query="+url.QueryEscape(q), &out); err != nil {
		t.Fatal(err)
	}
	for _, r := range out.Data.Result {
		for _, v := range r.Values {
			sec, ok := v[0].(float64)
			if !ok {
				t.Fatalf("ALERTS sample %v", v)
			}
			ts := time.UnixMilli(int64(sec * 1000))
			if ts.Before(activeAt) {
				continue // an earlier episode
			}
			switch r.Metric["alertstate"] {
			case "pending":
				if ts.After(lastPending) {
					lastPending = ts
				}
			case "firing":
				if firstFiring.IsZero() || ts.Before(firstFiring) {
					firstFiring = ts
				}
			}
		}
	}
	if lastPending.IsZero() || firstFiring.IsZero() {
		t.Fatalf("ALERTS has no pending and firing samples since %s: %+v", activeAt, out.Data.Result)
	}
	return lastPending, firstFiring
}

// missedEvaluations is Prometheus's own count of rule-group evaluations it
// missed (an evaluation that started late or ran longer than the interval).
func (p *prometheus) missedEvaluations(ctx context.Context, t *testing.T) float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var missed float64
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "prometheus_rule_group_iterations_missed_total{") || !strings.Contains(line, "idc-manager") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		missed += v
	}
	return missed
}

func (p *prometheus) expectNoAlert(ctx context.Context, alertname, name string) error {
	got, err := p.alerts(ctx, alertname, name)
	if err != nil {
		return err
	}
	if len(got) > 0 {
		return fmt.Errorf("%s for %s still %s", alertname, name, got[0].State)
	}
	return nil
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
