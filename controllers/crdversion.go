package controllers

import (
	"context"
	"fmt"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/config/crd/bases"
)

// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,resourceNames=idempotentconsumers.messaging.idempotency.dev,verbs=get

// CRDName is the IdempotentConsumer CRD's name.
const CRDName = "idempotentconsumers.messaging.idempotency.dev"

// OlderCRDError: the installed CRD lacks fields this manager's API has. The
// API server prunes an unknown field from every write, so the manager would
// lose what it writes there (status it records, defaults it relies on)
// without an error: it refuses to start instead.
type OlderCRDError struct {
	// Missing are the field paths (spec.…, status.…) the installed CRD's
	// schema lacks, sorted; NotServed is set when it does not serve this
	// manager's version at all.
	Missing   []string
	NotServed bool
}

func (e *OlderCRDError) Error() string {
	what := "does not serve " + messagingv1alpha1.GroupVersion.Version
	if !e.NotServed {
		shown := e.Missing
		if len(shown) > 8 {
			shown = append(shown[:8:8], fmt.Sprintf("and %d more", len(e.Missing)-8))
		}
		what = fmt.Sprintf("lacks %d field(s) of this manager's API (%s)", len(e.Missing), strings.Join(shown, ", "))
	}
	return fmt.Sprintf("the installed CRD %s is older than this manager: it %s. The API server would drop what the manager writes there, so it does not start. "+
		"Apply this release's CRD first (kubectl apply --server-side -f install.yaml; with Helm, which never upgrades crds/: "+
		"helm show crds <chart> | kubectl apply --server-side -f -), or run the manager of the release whose CRD is installed", CRDName, what)
}

// CheckInstalledCRD compares the installed IdempotentConsumer CRD with the
// one this manager was built with: it returns an *OlderCRDError when the
// installed one does not serve this version or lacks one of its fields
// (a newer CRD, with fields this manager does not know, is accepted). A
// manager that may not read the CRD (a namespaced install whose RBAC has no
// cluster-scoped rule) cannot tell: it returns skipped with no error.
func CheckInstalledCRD(ctx context.Context, cfg *rest.Config) (skipped bool, err error) {
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return false, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return false, fmt.Errorf("while reading the installed CRD: %w", err)
	}
	var installed apiextensionsv1.CustomResourceDefinition
	if err := c.Get(ctx, client.ObjectKey{Name: CRDName}, &installed); err != nil {
		if apierrors.IsForbidden(err) {
			return true, nil
		}
		return false, fmt.Errorf("while reading the installed CRD %s: %w", CRDName, err)
	}
	return false, CompareCRD(&installed)
}

// CompareCRD is CheckInstalledCRD's comparison, for an installed CRD
// already read.
func CompareCRD(installed *apiextensionsv1.CustomResourceDefinition) error {
	var built apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(bases.IdempotentConsumers, &built); err != nil {
		return fmt.Errorf("while reading the CRD this manager was built with: %w", err)
	}
	want, got := servedSchema(&built), servedSchema(installed)
	if want == nil {
		return fmt.Errorf("the CRD this manager was built with has no schema for %s", messagingv1alpha1.GroupVersion.Version)
	}
	if got == nil {
		return &OlderCRDError{NotServed: true}
	}
	have := map[string]bool{}
	schemaPaths("", got, have)
	need := map[string]bool{}
	schemaPaths("", want, need)
	var missing []string
	for p := range need {
		if !have[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	return &OlderCRDError{Missing: missing}
}

func servedSchema(crd *apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.JSONSchemaProps {
	for _, v := range crd.Spec.Versions {
		if v.Name == messagingv1alpha1.GroupVersion.Version && v.Served && v.Schema != nil && v.Schema.OpenAPIV3Schema != nil {
			return v.Schema.OpenAPIV3Schema
		}
	}
	return nil
}

// schemaPaths adds every field path under s to into: properties by name,
// list items as [], map values as {}. Below a field that preserves unknown
// fields, nothing is pruned, so nothing is missing either.
func schemaPaths(prefix string, s *apiextensionsv1.JSONSchemaProps, into map[string]bool) {
	if s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields {
		return
	}
	for name, p := range s.Properties {
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		if prefix == "" && name == "metadata" {
			continue
		}
		into[path] = true
		schemaPaths(path, &p, into)
	}
	if s.Items != nil && s.Items.Schema != nil {
		schemaPaths(prefix+"[]", s.Items.Schema, into)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		schemaPaths(prefix+"{}", s.AdditionalProperties.Schema, into)
	}
}
