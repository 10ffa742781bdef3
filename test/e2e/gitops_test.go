package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/gitopshealth"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// gitopsHealth: the Argo CD Lua health check and kstatus (Flux) say of LIVE
// resources on the node what config/argocd/health_test.yaml says of the
// fixture of the same state: Ready, Suspended, and Stalled on a Conflict (a
// second, newer resource claiming the same durable JetStream consumer). Each
// live object is dumped to $IDC_E2E_FIXTURES (make test-e2e: bin/e2e-fixtures)
// in the fixtures' form, to refresh config/argocd/testdata from a real run.
func (s *suite) gitopsHealth(ctx context.Context, t *testing.T) {
	argoDir := filepath.Join(testenv.RepoRoot(), "config", "argocd")
	script, err := gitopshealth.Script(argoDir)
	if err != nil {
		t.Fatal(err)
	}
	want := healthExpectations(t, argoDir)

	conflict := s.apply(ctx, t, appendManifest("ledger-conflict", "events_ledger", fmt.Sprintf(
		"    natsJetStream: {url: %q, stream: %s, consumer: jetstream-ledger}", localcluster.PodNATSURL, "IDC_E2E_LEDGER_"+strings.ToUpper(s.suffix)), 1, ""))
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := localcluster.WaitFor(wctx, s.c.Client, client.ObjectKeyFromObject(conflict), func(idc *messagingv1alpha1.IdempotentConsumer) bool {
		return localcluster.Condition(idc, messagingv1alpha1.ConditionStalled) == "True/"+messagingv1alpha1.ReasonConflict
	}, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		idc     *messagingv1alpha1.IdempotentConsumer
		fixture string
	}{{s.ledger, "ready.yaml"}, {s.orders, "suspended.yaml"}, {conflict, "stalled-conflict.yaml"}} {
		obj := s.liveObject(ctx, t, c.idc)
		exp, ok := want[c.fixture]
		if !ok {
			t.Fatalf("health_test.yaml has no expectation for %s", c.fixture)
		}
		argo, msg, err := gitopshealth.ArgoCD(script, obj.Object)
		if err != nil {
			t.Fatal(err)
		}
		ks, ksMsg, err := gitopshealth.Kstatus(obj)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s (like %s): Argo CD %s %q, kstatus %s %q", c.idc.Name, c.fixture, argo, msg, ks, ksMsg)
		if argo != exp.argo || ks != exp.kstatus {
			t.Fatalf("%s: Argo CD %s, kstatus %s; the fixture %s expects %s, %s", c.idc.Name, argo, ks, c.fixture, exp.argo, exp.kstatus)
		}
		s.dumpFixture(t, "e2e-"+c.fixture, obj)
	}
	if err := s.c.Client.Delete(ctx, conflict); err != nil {
		t.Fatal(err)
	}
}

type healthExpectation struct{ argo, kstatus string }

func healthExpectations(t *testing.T, argoDir string) map[string]healthExpectation {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(argoDir, "health_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Tests []struct {
			InputPath    string `json:"inputPath"`
			HealthStatus struct {
				Status string `json:"status"`
			} `json:"healthStatus"`
			Kstatus string `json:"kstatus"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(raw, &e); err != nil {
		t.Fatal(err)
	}
	out := map[string]healthExpectation{}
	for _, tc := range e.Tests {
		out[filepath.Base(tc.InputPath)] = healthExpectation{tc.HealthStatus.Status, tc.Kstatus}
	}
	return out
}

// liveObject reads the resource as the API server serves it (JSON numbers:
// what Argo CD and kstatus see).
func (s *suite) liveObject(ctx context.Context, t *testing.T, idc *messagingv1alpha1.IdempotentConsumer) *unstructured.Unstructured {
	t.Helper()
	out, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "get", "idc", idc.Name, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON([]byte(out)); err != nil {
		t.Fatal(err)
	}
	return u
}

// dumpFixture writes the object in the fixtures' form (no managedFields,
// uid or resourceVersion).
func (s *suite) dumpFixture(t *testing.T, name string, obj *unstructured.Unstructured) {
	t.Helper()
	dir := os.Getenv("IDC_E2E_FIXTURES")
	if dir == "" {
		return
	}
	o := obj.DeepCopy()
	for _, f := range []string{"managedFields", "uid", "resourceVersion", "creationTimestamp", "finalizers"} {
		unstructured.RemoveNestedField(o.Object, "metadata", f)
	}
	js, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.JSONToYAML(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), append([]byte("# Dumped from the e2e run on the real node (test/e2e/gitops_test.go).\n"), y...), 0o644); err != nil {
		t.Fatal(err)
	}
}
