// Package helmchart tests charts/idc-operator with the real helm binary
// (built from the Go module proxy by `make helm`): lint, golden renders,
// the values schema, namespaced RBAC, and that the chart's CRD and RBAC rules
// are the generated files of config/ and nothing else.
package helmchart

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "../../charts/idc-operator"
	releaseNS   = "idc-system"
	kubeVersion = "1.37.2"
	regenerate  = "regenerate: IDC_UPDATE_GOLDEN=1 go test ./test/helmchart"
)

func helmBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("IDC_HELM")
	if bin == "" {
		bin = "../../bin/helm"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("helm not found at %s (run `make helm`, or set IDC_HELM): %v", bin, err)
	}
	return bin
}

// helm runs the helm binary and returns its stdout, or its stderr as the error.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helmBin(t), args...)
	// Helm's cache, config and data in the test's own directory, not $HOME.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), errors.New(strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// render is `helm template` of the chart as release "idc" in idc-system.
func render(t *testing.T, valuesFile string, set ...string) (string, error) {
	t.Helper()
	args := []string{"template", "idc", chartDir, "--namespace", releaseNS, "--kube-version", kubeVersion}
	if valuesFile != "" {
		args = append(args, "--values", valuesFile)
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return helm(t, args...)
}

func mustRender(t *testing.T, valuesFile string, set ...string) string {
	t.Helper()
	out, err := render(t, valuesFile, set...)
	if err != nil {
		t.Fatalf("helm template (values %q, set %v): %v", valuesFile, set, err)
	}
	return out
}

func parseObjects(t *testing.T, manifest string) []unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifest), 4096)
	var objs []unstructured.Unstructured
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("parsing the rendered manifest: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

func TestLint(t *testing.T) {
	for _, values := range []string{"", "testdata/namespaced-values.yaml", "testdata/everything-values.yaml"} {
		args := []string{"lint", chartDir, "--strict", "--namespace", releaseNS, "--kube-version", kubeVersion}
		if values != "" {
			args = append(args, "--values", values)
		}
		if out, err := helm(t, args...); err != nil {
			t.Errorf("helm lint (values %q): %v\n%s", values, err, out)
		}
	}
}

// TestGolden compares `helm template` with the committed renders, so every
// change to what the chart installs shows up in review.
func TestGolden(t *testing.T) {
	cases := []struct{ name, values string }{
		{"default", ""},
		{"namespaced", "testdata/namespaced-values.yaml"},
		{"everything", "testdata/everything-values.yaml"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := elideCopies(mustRender(t, tc.values))
			golden := filepath.Join("testdata", tc.name+".golden.yaml")
			if os.Getenv("IDC_UPDATE_GOLDEN") == "1" {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (%s)", err, regenerate)
			}
			if got != string(want) {
				t.Errorf("helm template for %s differs from %s (%s):\n%s", tc.name, golden, regenerate, firstDiff(string(want), got))
			}
		})
	}
}

// elideCopies replaces what the chart copies from config/ (the manager's
// rules, the alerts, the dashboard) with a pointer to the source: those are
// checked byte-for-byte by TestChartCopiesAreCurrent and
// TestManagerRulesAreTheGeneratedRole, so a new RBAC marker or alert does
// not also need a golden update.
func elideCopies(manifest string) string {
	docs := strings.Split(manifest, "\n---\n")
	for i, d := range docs {
		var cut, note string
		switch {
		case (strings.Contains(d, "\nkind: ClusterRole\n") || strings.Contains(d, "\nkind: Role\n")) && strings.Contains(d, "\n  name: idc-idc-operator-manager\n"):
			cut, note = "\nrules:\n", "\nrules: [] # elided: config/rbac/role.yaml\n"
		case strings.Contains(d, "\nkind: PrometheusRule\n"):
			cut, note = "\nspec:\n", "\nspec: {} # elided: config/prometheus/rules.yaml\n"
		case strings.Contains(d, "\n  idc-operator.json: |\n"):
			cut, note = "\n  idc-operator.json: |\n", "\n  idc-operator.json: '' # elided: config/prometheus/dashboard.json\n"
		default:
			continue
		}
		if at := strings.Index(d, cut); at >= 0 {
			docs[i] = d[:at] + note
		}
	}
	return strings.Join(docs, "\n---\n")
}

func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return "line " + strconv.Itoa(i+1) + ":\n want: " + wl + "\n  got: " + gl
		}
	}
	return ""
}

// TestSchemaRefusesBadValues: values.schema.json refuses a wrong type, an
// unknown key and a bad value, and the message names the field.
func TestSchemaRefusesBadValues(t *testing.T) {
	cases := []struct {
		name string
		set  string
		want string
	}{
		{"unknown top-level key", "replicas=2", "additional properties 'replicas' not allowed"},
		{"unknown nested key", "image.tagg=v1", "at '/image': additional properties 'tagg' not allowed"},
		{"wrong type", "replicaCount=two", "at '/replicaCount': got string, want integer"},
		{"wrong type for a duration", "retentionPeriod=5", "at '/retentionPeriod': got number, want string"},
		{"not a duration", "retentionPeriod=soon", "at '/retentionPeriod'"},
		{"bad enum", "image.pullPolicy=Sometimes", "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'"},
		{"bad namespace name", "watchNamespaces={Team_A}", "at '/watchNamespaces/0': 'Team_A' does not match pattern"},
		{"list instead of a map", "nodeSelector={a}", "at '/nodeSelector': got array, want object"},
		{"zero concurrency", "maxConcurrentReconciles=0", "at '/maxConcurrentReconciles'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := render(t, "", tc.set)
			if err == nil {
				t.Fatalf("--set %s was accepted; rendered %d bytes", tc.set, len(out))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("--set %s: error %q does not contain %q", tc.set, err, tc.want)
			}
		})
	}
	// A combination the schema cannot express, refused by the template.
	if _, err := render(t, "", "replicaCount=2", "leaderElection.enabled=false"); err == nil || !strings.Contains(err.Error(), "replicaCount > 1 needs leaderElection.enabled") {
		t.Errorf("2 replicas without leader election: want a refusal naming both values, got %v", err)
	}
	// A whole values file with a typo is refused the same way (helm install -f).
	if _, err := render(t, "testdata/bad-values.yaml"); err == nil || !strings.Contains(err.Error(), "additional properties 'watchNamespace' not allowed") {
		t.Errorf("testdata/bad-values.yaml: want the unknown key watchNamespace named, got %v", err)
	}
}

// TestChartCopiesAreCurrent is the drift check: the chart's CRD, RBAC rules,
// alerts and dashboard are byte-for-byte the files under config/ (make
// manifests copies them), and the chart's version is the Makefile's VERSION.
func TestChartCopiesAreCurrent(t *testing.T) {
	copies := []struct {
		dir     string
		sources []string // globs
	}{
		{chartDir + "/crds", []string{"../../config/crd/bases/*.yaml"}},
		{chartDir + "/files/rbac", []string{"../../config/rbac/*role.yaml"}},
		{chartDir + "/files/prometheus", []string{"../../config/prometheus/rules.yaml", "../../config/prometheus/dashboard.json"}},
	}
	for _, c := range copies {
		var sources []string
		for _, g := range c.sources {
			m, err := filepath.Glob(g)
			if err != nil || len(m) == 0 {
				t.Fatalf("no files match %s: %v", g, err)
			}
			sources = append(sources, m...)
		}
		inChart, _ := filepath.Glob(c.dir + "/*")
		if len(inChart) != len(sources) {
			t.Errorf("%s has %d files, want copies of %v: run make manifests", c.dir, len(inChart), sources)
		}
		for _, src := range sources {
			want, _ := os.ReadFile(src)
			got, err := os.ReadFile(filepath.Join(c.dir, filepath.Base(src)))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s is not a current copy of %s: run make manifests", filepath.Join(c.dir, filepath.Base(src)), src)
			}
		}
	}

	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION \?= (\S+)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("no `VERSION ?=` line in the Makefile")
	}
	var chart struct{ Version, AppVersion string }
	raw, _ := os.ReadFile(chartDir + "/Chart.yaml")
	if err := yaml.Unmarshal(raw, &chart); err != nil {
		t.Fatal(err)
	}
	if chart.Version != string(m[1]) || chart.AppVersion != string(m[1]) {
		t.Errorf("Chart.yaml version %q appVersion %q, Makefile VERSION %q: run make manifests", chart.Version, chart.AppVersion, m[1])
	}
}

// TestManagerRulesAreTheGeneratedRole: what the chart grants the manager is
// exactly config/rbac/role.yaml (generated from the controller's markers).
func TestManagerRulesAreTheGeneratedRole(t *testing.T) {
	raw, err := os.ReadFile("../../config/rbac/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var generated struct {
		Rules []any `json:"rules"`
	}
	if err := yaml.Unmarshal(raw, &generated); err != nil {
		t.Fatal(err)
	}
	check := func(kind, ns string, objs []unstructured.Unstructured) {
		t.Helper()
		role := find(objs, kind, ns, "idc-idc-operator-manager")
		if role == nil {
			t.Fatalf("no %s idc-idc-operator-manager in namespace %q", kind, ns)
		}
		if !reflect.DeepEqual(role.Object["rules"], generated.Rules) {
			t.Errorf("%s %s/%s rules differ from config/rbac/role.yaml", kind, ns, role.GetName())
		}
	}
	check("ClusterRole", "", parseObjects(t, mustRender(t, "")))
	ns := parseObjects(t, mustRender(t, "", "watchNamespaces={a,b}"))
	check("Role", "a", ns)
	check("Role", "b", ns)
}

func find(objs []unstructured.Unstructured, kind, ns, name string) *unstructured.Unstructured {
	for i := range objs {
		if objs[i].GetKind() == kind && objs[i].GetNamespace() == ns && objs[i].GetName() == name {
			return &objs[i]
		}
	}
	return nil
}

// watchedResources are what the manager reconciles or owns: in namespaced
// mode no ClusterRole bound to it may grant any of them.
var watchedResources = map[string]bool{
	"idempotentconsumers": true, "idempotentconsumers/status": true, "idempotentconsumers/finalizers": true,
	"deployments": true, "cronjobs": true, "configmaps": true, "secrets": true, "events": true,
}

func TestNamespacedMode(t *testing.T) {
	objs := parseObjects(t, mustRender(t, "testdata/namespaced-values.yaml"))
	const sa = "idc-idc-operator"

	roles := map[string]*unstructured.Unstructured{}
	for i := range objs {
		o := &objs[i]
		switch o.GetKind() {
		case "Role":
			roles[o.GetNamespace()+"/"+o.GetName()] = o
		case "ClusterRoleBinding":
			if !bindsServiceAccount(o, releaseNS, sa) {
				continue
			}
			roleName, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
			cr := find(objs, "ClusterRole", "", roleName)
			if cr == nil {
				t.Fatalf("ClusterRoleBinding %s refers to ClusterRole %s, which the chart does not render", o.GetName(), roleName)
			}
			for _, r := range grantedResources(cr) {
				if watchedResources[r] {
					t.Errorf("namespaced mode binds ClusterRole %s to the manager, and it grants %q cluster-wide", roleName, r)
				}
			}
		case "RoleBinding":
			if o.GetNamespace() != "a" && o.GetNamespace() != releaseNS {
				t.Errorf("RoleBinding %s in namespace %s: only a (watched) and %s (leader election) expected", o.GetName(), o.GetNamespace(), releaseNS)
			}
		}
	}
	if roles["a/idc-idc-operator-manager"] == nil {
		t.Fatalf("no manager Role in the watched namespace a; Roles: %v", keys(roles))
	}
	for key, r := range roles {
		if key == "a/idc-idc-operator-manager" {
			continue
		}
		if key != releaseNS+"/idc-idc-operator-leader-election" {
			t.Errorf("unexpected Role %s", key)
			continue
		}
		for _, res := range grantedResources(r) {
			if res != "leases" && res != "events" {
				t.Errorf("the leader-election Role grants %q", res)
			}
		}
	}

	dep := find(objs, "Deployment", releaseNS, sa)
	if dep == nil {
		t.Fatal("no manager Deployment")
	}
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	if !slices.Contains(args, "--watch-namespaces=a") {
		t.Errorf("manager args %v lack --watch-namespaces=a", args)
	}

	// And the default, cluster-wide mode is one ClusterRole with the same rules.
	all := parseObjects(t, mustRender(t, ""))
	for _, o := range all {
		if o.GetKind() == "Role" && o.GetName() != "idc-idc-operator-leader-election" {
			t.Errorf("cluster-wide mode renders Role %s/%s", o.GetNamespace(), o.GetName())
		}
	}
	if find(all, "ClusterRoleBinding", "", "idc-idc-operator-manager") == nil {
		t.Error("cluster-wide mode has no manager ClusterRoleBinding")
	}
}

func bindsServiceAccount(b *unstructured.Unstructured, ns, name string) bool {
	subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
	for _, s := range subjects {
		m, _ := s.(map[string]any)
		if m["kind"] == "ServiceAccount" && m["namespace"] == ns && m["name"] == name {
			return true
		}
	}
	return false
}

func grantedResources(role *unstructured.Unstructured) []string {
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	var out []string
	for _, r := range rules {
		m, _ := r.(map[string]any)
		res, _, _ := unstructured.NestedStringSlice(m, "resources")
		out = append(out, res...)
	}
	return out
}

func keys(m map[string]*unstructured.Unstructured) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestTemplateWithoutKubeVersion runs `helm template` as a user would, with
// no --kube-version: helm then assumes the Kubernetes version stamped into it
// at build time, which `make helm` sets from helm's client-go the way helm's
// release build does (unstamped, helm assumes v1.20.0, below the chart's
// kubeVersion, and refuses to render).
func TestTemplateWithoutKubeVersion(t *testing.T) {
	out, err := helm(t, "template", "t", chartDir)
	if err != nil {
		t.Fatalf("helm template t %s (no --kube-version): %v", chartDir, err)
	}
	if !strings.Contains(out, "kind: Deployment") {
		t.Fatalf("helm template rendered no Deployment:\n%s", out)
	}

	// The assumed version itself, as a template sees it.
	probe := t.TempDir()
	writeFile(t, filepath.Join(probe, "Chart.yaml"), "apiVersion: v2\nname: probe\nversion: 0.1.0\n")
	writeFile(t, filepath.Join(probe, "templates", "v.yaml"), "kubeVersion: {{ .Capabilities.KubeVersion.Version }}\n")
	out, err = helm(t, "template", "t", probe)
	if err != nil {
		t.Fatalf("helm template of the probe chart: %v", err)
	}
	m := regexp.MustCompile(`kubeVersion: v1\.(\d+)\.0`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the probe chart printed no Kubernetes version v1.N.0:\n%s", out)
	}
	if minor, _ := strconv.Atoi(m[1]); minor < 30 {
		t.Fatalf("helm assumes Kubernetes v1.%d.0 without --kube-version; the chart needs >= 1.30 (was helm built by `make helm`?)", minor)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
