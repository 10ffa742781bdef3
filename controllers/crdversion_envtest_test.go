package controllers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/idempotency-dev/idc-operator/config/crd/bases"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// TestInstalledCRDCheck runs CheckInstalledCRD (what the manager does
// before it starts) against a real API server of its own, whose installed
// CRD is first an older one (this build's without status.inbox.epoch and
// spec.runtime.autoscaling.natsAccount, as a Helm upgrade that left crds/
// alone would leave it), then this build's.
func TestInstalledCRDCheck(t *testing.T) {
	assets, err := testenv.Assets()
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(bases.IdempotentConsumers, &crd); err != nil {
		t.Fatal(err)
	}
	older := crd.DeepCopy()
	schema := older.Spec.Versions[0].Schema.OpenAPIV3Schema
	status := schema.Properties["status"]
	inbox := status.Properties["inbox"]
	delete(inbox.Properties, "epoch")
	status.Properties["inbox"] = inbox
	schema.Properties["status"] = status
	spec := schema.Properties["spec"]
	rt := spec.Properties["runtime"]
	auto := rt.Properties["autoscaling"]
	delete(auto.Properties, "natsAccount")
	rt.Properties["autoscaling"], spec.Properties["runtime"], schema.Properties["spec"] = auto, rt, spec

	env := &envtest.Environment{BinaryAssetsDirectory: assets, CRDs: []*apiextensionsv1.CustomResourceDefinition{older}}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	skipped, err := CheckInstalledCRD(ctx, cfg)
	var olderErr *OlderCRDError
	if skipped || !errors.As(err, &olderErr) {
		t.Fatalf("against the older CRD: skipped %t, err %v; want an *OlderCRDError", skipped, err)
	}
	if strings.Join(olderErr.Missing, ",") != "spec.runtime.autoscaling.natsAccount,status.inbox.epoch" {
		t.Fatalf("missing %q, want exactly the two removed fields", olderErr.Missing)
	}
	for _, want := range []string{"older than this manager", "status.inbox.epoch", "helm show crds <chart> | kubectl apply --server-side -f -"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the message lacks %q: %s", want, err)
		}
	}
	t.Logf("CRD older than the manager: %v", err)

	// This build's CRD applied over it: the manager starts.
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	var live apiextensionsv1.CustomResourceDefinition
	if err := c.Get(ctx, client.ObjectKey{Name: CRDName}, &live); err != nil {
		t.Fatal(err)
	}
	live.Spec = crd.Spec
	if err := c.Update(ctx, &live); err != nil {
		t.Fatal(err)
	}
	if skipped, err := CheckInstalledCRD(ctx, cfg); skipped || err != nil {
		t.Fatalf("against this build's CRD: skipped %t, err %v; want it accepted", skipped, err)
	}
	// A CRD that does not serve v1alpha1 at all.
	notServed := crd.DeepCopy()
	notServed.Spec.Versions[0].Served = false
	if err := CompareCRD(notServed); !errors.As(err, &olderErr) || !olderErr.NotServed {
		t.Fatalf("a CRD not serving v1alpha1: %v", err)
	}
}
