package controllers

import (
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// The children a consumer gets (Deployment, prune CronJob,
// PodDisruptionBudget, NetworkPolicy), rendered as the reconciler renders
// them; with IDC_CHILDREN_OUT set they are written there as one YAML
// stream, which `make kube-score` scores.
func TestRenderedChildrenForKubeScore(t *testing.T) {
	idc := unitConsumer()
	rc := mustRender(t, idc)
	getenv := func(string) string { return "postgres://app@10.0.0.5:5432/app" }
	children := []client.Object{
		specs.Deployment(idc, rc, "idc-operator:0.2.0", "h", specs.Workloads(idc)[0]),
		specs.PruneCronJob(idc, rc, "idc-operator:0.2.0", "h", 49*time.Hour),
		specs.PodDisruptionBudget(idc, specs.Workloads(idc)[0]),
		specs.NetworkPolicy(idc, rc, getenv),
	}
	var docs []string
	for _, c := range children {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(c)
		if err != nil {
			t.Fatal(err)
		}
		b, err := yaml.Marshal(u)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "kind: ") {
			t.Fatalf("%T renders without its kind", c)
		}
		docs = append(docs, string(b))
	}
	if out := os.Getenv("IDC_CHILDREN_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
