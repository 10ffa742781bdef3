package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

const apiReference = "docs/reference/api.md"

// typeSections reads the generated reference: for each "#### Type" section,
// its field rows, each with the anchor of the field's own type when that is
// a section of the same page.
func typeSections(t *testing.T) map[string]map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, apiReference))
	if err != nil {
		t.Fatalf("%s: %v (make manifests writes it)", apiReference, err)
	}
	rowRE := regexp.MustCompile("^\\| `([^`]+)` _(.*?)_ \\|")
	linkRE := regexp.MustCompile(`\[[^]]*\]\(#([^)]+)\)`)
	out := map[string]map[string]string{}
	var cur map[string]string
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "#### "); ok {
			cur = map[string]string{}
			out[anchor(strings.TrimSpace(h))] = cur
			continue
		}
		if m := rowRE.FindStringSubmatch(line); m != nil && cur != nil {
			typ := ""
			if l := linkRE.FindStringSubmatch(m[2]); l != nil {
				typ = l[1]
			}
			cur[m[1]] = typ
		}
	}
	return out
}

// TestAPIReferenceCoversEveryCRDField walks the CRD's schema and the
// generated reference together, from IdempotentConsumer down: every
// property of every object must be a row of its type's section.
func TestAPIReferenceCoversEveryCRDField(t *testing.T) {
	crds, err := filepath.Glob(filepath.Join(root, "config/crd/bases/*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRD under config/crd/bases: %v", err)
	}
	sections := typeSections(t)
	checked := 0
	for _, path := range crds {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatal(err)
		}
		for _, v := range crd.Spec.Versions {
			kind := anchor(crd.Spec.Names.Kind)
			if sections[kind] == nil {
				t.Fatalf("%s has no section %s", apiReference, crd.Spec.Names.Kind)
			}
			checked += walk(t, sections, kind, crd.Spec.Names.Kind, *v.Schema.OpenAPIV3Schema)
		}
	}
	if checked < 100 {
		t.Fatalf("only %d fields checked: the walk lost its way", checked)
	}
	t.Logf("%d CRD fields found in %s", checked, apiReference)
}

func walk(t *testing.T, sections map[string]map[string]string, section, path string, s apiextensionsv1.JSONSchemaProps) int {
	t.Helper()
	rows := sections[section]
	names := make([]string, 0, len(s.Properties))
	for n := range s.Properties {
		names = append(names, n)
	}
	sort.Strings(names)
	n := 0
	for _, name := range names {
		p := s.Properties[name]
		field := path + "." + name
		typ, ok := rows[name]
		if !ok {
			t.Errorf("%s: the CRD field %s is not in section %q of %s", apiReference, field, section, apiReference)
			continue
		}
		n++
		if name == "metadata" {
			continue
		}
		for p.Type == "array" && p.Items != nil && p.Items.Schema != nil {
			p = *p.Items.Schema
		}
		if len(p.Properties) == 0 {
			continue
		}
		if typ == "" || sections[typ] == nil {
			// A type documented elsewhere (metav1.Condition, corev1
			// resources) is Kubernetes' own reference.
			continue
		}
		n += walk(t, sections, typ, field, p)
	}
	return n
}

// TestAPIReferenceIsCurrent regenerates the reference from api/ with the
// same crd-ref-docs and config as `make manifests` and compares: a type
// changed without `make manifests` fails here (with the Makefile's flags:
// --max-depth=16 reaches the placement types' requirements) (and in CI's "generated files
// are current" step).
func TestAPIReferenceIsCurrent(t *testing.T) {
	bin := os.Getenv("IDC_CRD_REF_DOCS")
	if bin == "" {
		bin = filepath.Join(root, "bin/crd-ref-docs")
	}
	bin, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("crd-ref-docs not found at %s (run `make crd-ref-docs`, or set IDC_CRD_REF_DOCS): %v", bin, err)
	}
	out := filepath.Join(t.TempDir(), "api.md")
	cmd := exec.Command(bin, "--log-level=WARN", "--max-depth=16", "--source-path=./api", "--config=hack/crd-ref-docs/config.yaml", "--renderer=markdown", "--output-path="+out)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("crd-ref-docs: %v\n%s", err, b)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, apiReference))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("%s is stale: run `make manifests` and commit it", apiReference)
	}
}
