// Package gitops runs the health assessments GitOps tools apply to an
// IdempotentConsumer against the status fixtures in config/argocd/testdata:
// the Argo CD Lua health check shipped in config/argocd/argocd-cm.yaml, run
// with gopher-lua the way Argo CD runs resource customizations, and kstatus
// (sigs.k8s.io/cli-utils/pkg/kstatus), which Flux uses.
package gitops

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/idempotency-dev/idc-operator/internal/gitopshealth"
)

const argoDir = "../../config/argocd"

// expectations is config/argocd/health_test.yaml: argo-cd's health_test.yaml
// form plus the kstatus result.
type expectations struct {
	Tests []struct {
		InputPath    string `json:"inputPath"`
		HealthStatus struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"healthStatus"`
		Kstatus string `json:"kstatus"`
	} `json:"tests"`
}

func loadExpectations(t *testing.T) expectations {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(argoDir, "health_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var e expectations
	if err := yaml.UnmarshalStrict(raw, &e); err != nil {
		t.Fatalf("health_test.yaml: %v", err)
	}
	// Every fixture has an expectation, so a new fixture cannot go untested.
	fixtures, err := filepath.Glob(filepath.Join(argoDir, "testdata", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, tc := range e.Tests {
		listed[filepath.Base(tc.InputPath)] = true
	}
	for _, f := range fixtures {
		if !listed[filepath.Base(f)] {
			t.Errorf("fixture %s has no expectation in health_test.yaml", f)
		}
	}
	if len(e.Tests) < 10 {
		t.Fatalf("health_test.yaml lists only %d tests", len(e.Tests))
	}
	return e
}

func loadFixture(t *testing.T, inputPath string) *unstructured.Unstructured {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(argoDir, inputPath))
	if err != nil {
		t.Fatal(err)
	}
	// Through JSON as the API server serves it: integers stay int64.
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatalf("%s: %v", inputPath, err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(js); err != nil {
		t.Fatalf("%s: %v", inputPath, err)
	}
	return u
}

// healthScript is the Lua Argo CD would run, taken from the shipped ConfigMap.
func healthScript(t *testing.T) string {
	t.Helper()
	script, err := gitopshealth.Script(argoDir)
	if err != nil {
		t.Fatal(err)
	}
	return script
}

func TestArgoCDHealthCheck(t *testing.T) {
	script := healthScript(t)
	for _, tc := range loadExpectations(t).Tests {
		t.Run(strings.TrimSuffix(filepath.Base(tc.InputPath), ".yaml"), func(t *testing.T) {
			obj := loadFixture(t, tc.InputPath)
			got, msg, err := gitopshealth.ArgoCD(script, obj.Object)
			if err != nil {
				t.Fatalf("the health script failed: %v", err)
			}
			if got != tc.HealthStatus.Status {
				t.Errorf("health %s (%q), want %s", got, msg, tc.HealthStatus.Status)
			}
			if tc.HealthStatus.Message != "" && msg != tc.HealthStatus.Message {
				t.Errorf("message %q, want %q", msg, tc.HealthStatus.Message)
			}
			// A person reading Argo CD must see why: the message carries the
			// reason of the condition that decided.
			if reason := decidingReason(obj); reason != "" && !strings.HasPrefix(msg, reason) {
				t.Errorf("message %q does not start with the deciding reason %q", msg, reason)
			}
		})
	}
}

// decidingReason is the reason an operator should see: Stalled's when True,
// else Ready's when it is on the current generation.
func decidingReason(obj *unstructured.Unstructured) string {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	byType := map[string]map[string]any{}
	for _, c := range conds {
		m, _ := c.(map[string]any)
		typ, _ := m["type"].(string)
		byType[typ] = m
	}
	if s := byType["Stalled"]; s != nil && s["status"] == "True" {
		r, _ := s["reason"].(string)
		return r
	}
	r := byType["Ready"]
	if r == nil {
		return ""
	}
	gen := obj.GetGeneration()
	if og, ok := r["observedGeneration"].(int64); ok && og < gen {
		return ""
	}
	reason, _ := r["reason"].(string)
	observed, _, _ := unstructured.NestedInt64(obj.Object, "status", "observedGeneration")
	if observed < gen && r["status"] == "True" {
		return "" // a Ready of the old spec says nothing about the new one
	}
	return reason
}

func TestKstatus(t *testing.T) {
	for _, tc := range loadExpectations(t).Tests {
		t.Run(strings.TrimSuffix(filepath.Base(tc.InputPath), ".yaml"), func(t *testing.T) {
			got, msg, err := gitopshealth.Kstatus(loadFixture(t, tc.InputPath))
			if err != nil {
				t.Fatalf("kstatus: %v", err)
			}
			if got != tc.Kstatus {
				t.Errorf("kstatus %s (%q), want %s", got, msg, tc.Kstatus)
			}
		})
	}
}
