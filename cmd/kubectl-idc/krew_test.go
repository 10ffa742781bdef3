package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestKrewManifest renders plugins/krew/idc.yaml as krew-release-bot would
// and checks it against the archives `make dist-plugin` writes: one
// platform per PLUGIN_PLATFORMS entry, each archive named as the Makefile
// names it, holding bin kubectl-idc.
func TestKrewManifest(t *testing.T) {
	raw, err := os.ReadFile("../../plugins/krew/idc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	const tag = "v0.2.0"
	rendered := regexp.MustCompile(`\{\{addURIAndSha "([^"]+)" \.TagName \}\}`).ReplaceAllStringFunc(string(raw), func(m string) string {
		url := regexp.MustCompile(`"([^"]+)"`).FindStringSubmatch(m)[1]
		return "uri: " + url + "\n    sha256: " + strings.Repeat("0", 64)
	})
	rendered = strings.ReplaceAll(rendered, "{{ .TagName }}", tag)
	var plugin struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Version          string `json:"version"`
			ShortDescription string `json:"shortDescription"`
			Homepage         string `json:"homepage"`
			Description      string `json:"description"`
			Caveats          string `json:"caveats"`
			Platforms        []struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"selector"`
				URI    string `json:"uri"`
				SHA256 string `json:"sha256"`
				Bin    string `json:"bin"`
			} `json:"platforms"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict([]byte(rendered), &plugin, yaml.DisallowUnknownFields); err != nil {
		t.Fatalf("the rendered manifest: %v\n%s", err, rendered)
	}
	if plugin.Kind != "Plugin" || plugin.Metadata.Name != "idc" || plugin.Spec.Version != tag || plugin.Spec.ShortDescription == "" {
		t.Errorf("manifest: %+v", plugin)
	}
	m := regexp.MustCompile(`(?m)^PLUGIN_PLATFORMS \?= (.+)$`).FindSubmatch(mk)
	if m == nil || !strings.Contains(string(mk), "name=kubectl-idc_v$(VERSION)_$${os}_$${arch}.tar.gz") {
		t.Fatal("the Makefile no longer names PLUGIN_PLATFORMS or the archives as this test expects")
	}
	var got []string
	for _, p := range plugin.Spec.Platforms {
		os, arch := p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"]
		got = append(got, os+"/"+arch)
		if want := "/" + tag + "/kubectl-idc_" + tag + "_" + os + "_" + arch + ".tar.gz"; !strings.HasSuffix(p.URI, want) || p.Bin != "kubectl-idc" {
			t.Errorf("platform %s/%s: uri %s bin %s; want an archive ending %s holding kubectl-idc", os, arch, p.URI, p.Bin, want)
		}
	}
	want := strings.Fields(string(m[1]))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("krew platforms %v, make dist-plugin builds %v", got, want)
	}
}
