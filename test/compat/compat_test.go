// Package compat proves that what a previous release stored decodes and
// validates under this build: every directory test/compat/<version>/ holds
// that release's config/samples (samples/, from `git show
// <commit>:config/samples/...`) and objects its manager stored on the real
// node, status included (stored/, read with kubectl get -o json from a
// cluster running that release, server-side metadata dropped). Each decodes
// strictly into this build's types (a field renamed or removed fails), and
// each is applied through an API server with this build's CRD (OpenAPI and
// CEL validation, pruning): accepted, and a stored object reads back with
// nothing pruned.
package compat

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

const namespace = "compat"

type fixture struct {
	path   string
	stored bool // written by the release's manager: status included
	raw    []byte
}

func fixtures(t *testing.T) []fixture {
	t.Helper()
	var out []fixture
	for _, pattern := range []string{"*/samples/*.yaml", "*/stored/*.json"} {
		paths, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "test", "compat", pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fixture{path: p, stored: strings.Contains(pattern, "stored"), raw: b})
		}
	}
	if len(out) < 8 {
		t.Fatalf("only %d fixtures under test/compat", len(out))
	}
	return out
}

func (f fixture) name() string {
	rel, _ := filepath.Rel(filepath.Join(testenv.RepoRoot(), "test", "compat"), f.path)
	return rel
}

// TestPreviousReleaseDecodes: every fixture decodes strictly, status
// included.
func TestPreviousReleaseDecodes(t *testing.T) {
	for _, f := range fixtures(t) {
		var idc messagingv1alpha1.IdempotentConsumer
		if err := yaml.UnmarshalStrict(f.raw, &idc); err != nil {
			t.Errorf("%s does not decode strictly under this build: %v", f.name(), err)
			continue
		}
		if f.stored && (idc.Status.Inbox == nil || idc.Status.Inbox.Epoch == "" || len(idc.Status.Conditions) == 0) {
			t.Errorf("%s: stored status decoded without its inbox or conditions: %+v", f.name(), idc.Status)
		}
	}
}

// TestPreviousReleaseApplies: every fixture is accepted by an API server
// with this build's CRD; a stored one keeps every field of its spec and
// status (nothing pruned, nothing refused by CEL on the status update).
func TestPreviousReleaseApplies(t *testing.T) {
	env, err := testenv.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(messagingv1alpha1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	for _, f := range fixtures(t) {
		var obj map[string]any
		if err := yaml.Unmarshal(f.raw, &obj); err != nil {
			t.Fatalf("%s: %v", f.name(), err)
		}
		u := &unstructured.Unstructured{Object: obj}
		u.SetNamespace(namespace)
		status, hasStatus := obj["status"]
		delete(obj, "status")
		if err := c.Create(ctx, u); err != nil {
			t.Errorf("%s: refused by this build's CRD: %v", f.name(), err)
			continue
		}
		if !f.stored {
			t.Logf("%s: accepted", f.name())
			continue
		}
		if !hasStatus {
			t.Fatalf("%s: a stored fixture without status", f.name())
		}
		u.Object["status"] = status
		if err := c.Status().Update(ctx, u); err != nil {
			t.Errorf("%s: its status is refused by this build's CRD: %v", f.name(), err)
			continue
		}
		back := &unstructured.Unstructured{}
		back.SetGroupVersionKind(u.GroupVersionKind())
		if err := c.Get(ctx, client.ObjectKeyFromObject(u), back); err != nil {
			t.Fatal(err)
		}
		var want map[string]any
		_ = yaml.Unmarshal(f.raw, &want)
		for _, field := range []string{"spec", "status"} {
			if !reflect.DeepEqual(normalize(t, back.Object[field]), normalize(t, want[field])) {
				got, _ := json.MarshalIndent(back.Object[field], "", " ")
				exp, _ := json.MarshalIndent(want[field], "", " ")
				t.Errorf("%s: %s read back differs from what the release stored (pruned or defaulted differently):\ngot  %s\nwant %s", f.name(), field, got, exp)
			}
		}
		t.Logf("%s: accepted, spec and status read back unchanged", f.name())
	}
}

// normalize round-trips v through JSON so numbers compare alike.
func normalize(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}
