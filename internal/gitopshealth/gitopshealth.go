// Package gitopshealth computes what GitOps tools say about an
// IdempotentConsumer: the Argo CD Lua health check shipped in
// config/argocd/argocd-cm.yaml, run with gopher-lua the way Argo CD runs
// resource customizations, and kstatus (sigs.k8s.io/cli-utils), which Flux
// uses. test/gitops runs it on the status fixtures, the e2e suite on live
// resources of the real node.
package gitopshealth

import (
	"fmt"
	"os"
	"path/filepath"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

// HealthKey is the argocd-cm key of the health check.
const HealthKey = "resource.customizations.health.messaging.idempotency.dev_IdempotentConsumer"

// Script is the Lua Argo CD would run, taken from the shipped ConfigMap in
// argoDir (config/argocd).
func Script(argoDir string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(argoDir, "argocd-cm.yaml"))
	if err != nil {
		return "", err
	}
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		return "", err
	}
	script := cm.Data[HealthKey]
	if cm.Kind != "ConfigMap" || script == "" {
		return "", fmt.Errorf("argocd-cm.yaml: no ConfigMap key %s", HealthKey)
	}
	return script, nil
}

// Kstatus is kstatus' verdict (Current, InProgress, Failed, ...).
func Kstatus(obj *unstructured.Unstructured) (string, string, error) {
	res, err := status.Compute(obj)
	if err != nil {
		return "", "", err
	}
	return string(res.Status), res.Message, nil
}

// ArgoCD runs the script as Argo CD does: a sandbox with only the base,
// table, string and math libraries, the resource as the global obj, and a
// table {status, message} returned.
func ArgoCD(script string, obj map[string]any) (status, message string, err error) {
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
