package e2e

import (
	"context"
	"encoding/json"
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

	"sigs.k8s.io/yaml"

	"github.com/idempotency-dev/idc-operator/internal/testenv"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

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
