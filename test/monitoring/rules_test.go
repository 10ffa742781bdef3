package monitoring

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	rulesFile     = "../../config/prometheus/rules.yaml"
	rulesTestFile = "../../config/prometheus/rules_test.yaml"
	dashboardFile = "../../config/prometheus/dashboard.json"
)

// prometheusRule is the part of a PrometheusRule these tests read.
type prometheusRule struct {
	Kind string `json:"kind"`
	Spec struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert string `json:"alert"`
				Expr  string `json:"expr"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

func readRule(t *testing.T) (prometheusRule, []byte) {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var r prometheusRule
	if err := yaml.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	if r.Kind != "PrometheusRule" || len(r.Spec.Groups) == 0 {
		t.Fatalf("%s: want a PrometheusRule with groups, got kind %q and %d groups", rulesFile, r.Kind, len(r.Spec.Groups))
	}
	var raw struct {
		Spec json.RawMessage `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	spec, err := yaml.JSONToYAML(raw.Spec)
	if err != nil {
		t.Fatal(err)
	}
	return r, spec
}

// TestRulesWithPromtool writes the PrometheusRule's spec as a plain rules
// file and runs `promtool check rules` and `promtool test rules` on it.
func TestRulesWithPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is required (Debian package prometheus): %v", err)
	}
	_, spec := readRule(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.spec.yaml"), spec, 0o600); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.spec.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %v: %v\n%s", args, err, out)
		}
		t.Logf("promtool %v:\n%s", args, out)
	}
}

// TestEveryAlertHasFiringAndQuietCases keeps rules_test.yaml complete: each
// alert is evaluated at least twice, once expecting alerts and once none.
func TestEveryAlertHasFiringAndQuietCases(t *testing.T) {
	r, _ := readRule(t)
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string            `json:"alertname"`
				ExpAlerts []json.RawMessage `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, g := range r.Spec.Groups {
		for _, rule := range g.Rules {
			if !fires[rule.Alert] || !quiet[rule.Alert] {
				t.Errorf("alert %s: rules_test.yaml needs a case that fires (%v) and one that does not (%v)", rule.Alert, fires[rule.Alert], quiet[rule.Alert])
			}
		}
	}
}

var metricName = regexp.MustCompile(`\bidc_[a-z0-9_]+`)

// managerGroup is the rule group on the manager's metrics, which the
// manager exports (per IdempotentConsumer), not the runtime pods.
const managerGroup = "idc-manager"

// managerNamedMetrics returns the idc_ metric names the manager group's
// alerts use.
func managerNamedMetrics(t *testing.T) map[string]string {
	t.Helper()
	r, _ := readRule(t)
	names := map[string]string{}
	for _, g := range r.Spec.Groups {
		if g.Name != managerGroup {
			continue
		}
		for _, rule := range g.Rules {
			for _, n := range metricName.FindAllString(rule.Expr, -1) {
				names[n] = "manager alert " + rule.Alert
			}
		}
	}
	return names
}

// namedMetrics returns the idc_ metric names used in the alert expressions
// and the dashboard's queries, each with where it is used.
func namedMetrics(t *testing.T) map[string]string {
	t.Helper()
	r, _ := readRule(t)
	names := map[string]string{}
	for _, g := range r.Spec.Groups {
		if g.Name == managerGroup {
			continue // managerNamedMetrics
		}
		for _, rule := range g.Rules {
			for _, n := range metricName.FindAllString(rule.Expr, -1) {
				names[n] = "alert " + rule.Alert
			}
		}
	}
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				names[n] = "dashboard panel " + p.Title
			}
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			for _, n := range metricName.FindAllString(q, -1) {
				names[n] = "dashboard variable"
			}
		}
	}
	return names
}

// missingMetrics lists the names (with where they are used) that exported
// does not contain, sorted.
func missingMetrics(names map[string]string, exported map[string]bool) []string {
	var out []string
	for n, where := range names {
		if !exported[n] {
			out = append(out, n+" ("+where+")")
		}
	}
	sort.Strings(out)
	return out
}
