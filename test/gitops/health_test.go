// Package gitops runs the health assessments GitOps tools apply to an
// IdempotentConsumer against the status fixtures in config/argocd/testdata:
// the Argo CD Lua health check shipped in config/argocd/argocd-cm.yaml, run
// with gopher-lua the way Argo CD runs resource customizations, and kstatus
// (sigs.k8s.io/cli-utils/pkg/kstatus), which Flux uses.
package gitops

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

const (
	argoDir   = "../../config/argocd"
	healthKey = "resource.customizations.health.messaging.idempotency.dev_IdempotentConsumer"
)

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
	raw, err := os.ReadFile(filepath.Join(argoDir, "argocd-cm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		t.Fatal(err)
	}
	script := cm.Data[healthKey]
	if cm.Kind != "ConfigMap" || script == "" {
		t.Fatalf("argocd-cm.yaml: no ConfigMap key %s", healthKey)
	}
	return script
}

// argoHealth runs the script as Argo CD does: a sandbox with only the base,
// table, string and math libraries, the resource as the global obj, and a
// table {status, message} returned.
func argoHealth(script string, obj map[string]any) (status, message string, err error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		l.Push(l.NewFunction(lib.open))
		l.Push(lua.LString(lib.name))
		l.Call(1, 0)
	}
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return "", "", err
	}
	ret, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return "", "", fmt.Errorf("the script returned %s, not a table", l.Get(-1).Type())
	}
	return lua.LVAsString(ret.RawGetString("status")), lua.LVAsString(ret.RawGetString("message")), nil
}

// toLua converts decoded JSON the way Argo CD's luajson does: objects and
// arrays become tables (arrays 1-based), numbers become Lua numbers.
func toLua(l *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(x)
	case string:
		return lua.LString(x)
	case float64:
		return lua.LNumber(x)
	case int64:
		return lua.LNumber(x)
	case int:
		return lua.LNumber(x)
	case []any:
		t := l.NewTable()
		for _, e := range x {
			t.Append(toLua(l, e))
		}
		return t
	case map[string]any:
		t := l.NewTable()
		for k, e := range x {
			t.RawSetString(k, toLua(l, e))
		}
		return t
	default:
		return lua.LString(fmt.Sprint(x))
	}
}

func TestArgoCDHealthCheck(t *testing.T) {
	script := healthScript(t)
	for _, tc := range loadExpectations(t).Tests {
		t.Run(strings.TrimSuffix(filepath.Base(tc.InputPath), ".yaml"), func(t *testing.T) {
			obj := loadFixture(t, tc.InputPath)
			got, msg, err := argoHealth(script, obj.Object)
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
			res, err := status.Compute(loadFixture(t, tc.InputPath))
			if err != nil {
				t.Fatalf("kstatus: %v", err)
			}
			if string(res.Status) != tc.Kstatus {
				t.Errorf("kstatus %s (%q), want %s", res.Status, res.Message, tc.Kstatus)
			}
		})
	}
}
