package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const repoURL = "https://github.com/idempotency-dev/idc-operator"

// TestRunbookURLsResolve: every alert's runbook_url (config/prometheus and
// the chart's copy) names a page of this repository and a heading in it.
func TestRunbookURLsResolve(t *testing.T) {
	urlRE := regexp.MustCompile(`runbook_url:\s*(\S+)`)
	n := 0
	for _, rules := range []string{"config/prometheus/rules.yaml", "charts/idc-operator/files/prometheus/rules.yaml"} {
		b, err := os.ReadFile(filepath.Join(root, rules))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range urlRE.FindAllStringSubmatch(string(b), -1) {
			n++
			url := strings.Trim(m[1], `"'`)
			rest, ok := strings.CutPrefix(url, repoURL)
			page, frag, _ := strings.Cut(rest, "#")
			switch {
			case !ok || frag == "":
				t.Errorf("%s: runbook_url %s is not %s/blob/main/<page>#<heading>", rules, url, repoURL)
				continue
			case page == "":
				page = "README.md"
			default:
				var found bool
				if page, found = strings.CutPrefix(page, "/blob/main/"); !found {
					t.Errorf("%s: runbook_url %s: want %s/blob/main/<page>#<heading>", rules, url, repoURL)
					continue
				}
			}
			path := filepath.Join(root, page)
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: runbook_url %s: %v", rules, url, err)
				continue
			}
			if !anchors(t, path)[frag] {
				t.Errorf("%s: runbook_url %s: no heading #%s in %s", rules, url, frag, page)
			}
		}
	}
	if n == 0 {
		t.Fatal("no runbook_url found: the scan lost its way")
	}
}
