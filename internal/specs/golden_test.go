package specs

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

var update = flag.Bool("update", false, "rewrite the testdata/*.golden.yaml files from the renderers' output")

// goldenInput is one fixture: a resource and what the controller hands the
// renderers for it (testdata/<fixture>.input.yaml).
type goldenInput struct {
	Consumer messagingv1alpha1.IdempotentConsumer `json:"consumer"`
	// Config is the rendered runtime config; ConfigHash stands for its hash.
	Config     config.Config `json:"config"`
	ConfigHash string        `json:"configHash"`
	Secrets    []struct {
		Env string                         `json:"env"`
		Ref messagingv1alpha1.SecretKeyRef `json:"ref"`
	} `json:"secrets"`
	// Env are the credential values by env var (the NetworkPolicy reads
	// the hosts in them).
	Env         map[string]string `json:"env"`
	Image       string            `json:"image"`
	SecretsHash string            `json:"secretsHash"`
	// Window is the retention window in force (empty: unresolved).
	Window string `json:"window"`
	// Paused holds an autoscaled Deployment at 0.
	Paused  bool `json:"paused"`
	Redrive struct {
		Token  string   `json:"token"`
		Reason string   `json:"reason"`
		IDs    []string `json:"ids"`
	} `json:"redrive"`
}

func (in *goldenInput) window(t *testing.T) time.Duration {
	if in.Window == "" {
		return 0
	}
	w, err := time.ParseDuration(in.Window)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// Every renderer's output for every fixture matches its golden file
// (testdata/<fixture>.<object>.golden.yaml); go test -run TestGolden
// -update rewrites them.
func TestGoldenRenderings(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*.input.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no fixtures in testdata (%v)", err)
	}
	for _, path := range inputs {
		fixture := strings.TrimSuffix(filepath.Base(path), ".input.yaml")
		t.Run(fixture, func(t *testing.T) {
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var in goldenInput
			if err := yaml.UnmarshalStrict(raw, &in); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			for object, obj := range renderGolden(t, &in) {
				got, err := yaml.Marshal(obj)
				if err != nil {
					t.Fatal(err)
				}
				compareGolden(t, filepath.Join("testdata", fixture+"."+object+".golden.yaml"), got)
			}
		})
	}
}

func compareGolden(t *testing.T, file string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(file, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (go test -run TestGoldenRenderings -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the rendering:\n%s", file, lineDiff(string(want), string(got)))
	}
}

// lineDiff lists the lines only in want (-) and only in got (+), in order.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	// Longest common subsequence, small inputs.
	lcs := make([][]int, len(w)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(g)+1)
	}
	for i := len(w) - 1; i >= 0; i-- {
		for j := len(g) - 1; j >= 0; j-- {
			if w[i] == g[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out strings.Builder
	i, j := 0, 0
	for i < len(w) || j < len(g) {
		switch {
		case i < len(w) && j < len(g) && w[i] == g[j]:
			i, j = i+1, j+1
		case j < len(g) && (i == len(w) || lcs[i][j+1] >= lcs[i+1][j]):
			out.WriteString("+ " + g[j] + "\n")
			j++
		default:
			out.WriteString("- " + w[i] + "\n")
			i++
		}
	}
	return out.String()
}

// renderGolden renders every child of a fixture, by object name.
func renderGolden(t *testing.T, in *goldenInput) map[string]any {
	t.Helper()
	js, err := json.Marshal(&in.Config)
	if err != nil {
		t.Fatal(err)
	}
	rc := &RuntimeConfig{Config: &in.Config, JSON: js, Hash: in.ConfigHash}
	for _, s := range in.Secrets {
		rc.Secrets = append(rc.Secrets, SecretEnv{Env: s.Env, Ref: s.Ref})
	}
	idc := &in.Consumer
	getenv := func(name string) string { return in.Env[name] }
	out := map[string]any{
		"configmap":           ConfigMap(idc, rc),
		"deployment":          Deployment(idc, rc, in.Image, in.SecretsHash, Workloads(idc)[0]),
		"cronjob":             PruneCronJob(idc, rc, in.Image, in.SecretsHash, in.window(t)),
		"poddisruptionbudget": PodDisruptionBudget(idc, Workloads(idc)[0]),
		"networkpolicy":       NetworkPolicy(idc, rc, getenv),
		"redrive-job":         RedriveJob(idc, rc, in.Image, in.SecretsHash, in.Redrive.Token, in.Redrive.Reason, in.Redrive.IDs),
	}
	if idc.Spec.Runtime.Autoscaling != nil {
		so, ta, err := ScaledObject(idc, rc, ScaleHold{Paused: in.Paused}, Workloads(idc)[0])
		if err != nil {
			t.Fatal(err)
		}
		out["scaledobject"] = so
		if ta != nil {
			out["triggerauthentication"] = ta
		}
	}
	return out
}
