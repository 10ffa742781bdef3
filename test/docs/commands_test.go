package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// commandFences are the code blocks that hold commands to run.
var commandFences = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}

var markerRE = regexp.MustCompile(`^<!--\s*(illustrative|tested:\s*([^>]*?))\s*-->$`)

// TestEveryCommandIsTestedOrIllustrative: each sh/bash/console block of
// README.md and docs/ follows a marker line, either
//
//	<!-- illustrative -->
//	<!-- tested: TestName, TestName/step -->
//
// and each named test exists (a step name must appear in the file that
// defines the test).
func TestEveryCommandIsTestedOrIllustrative(t *testing.T) {
	tests := testSources(t)
	blocks := 0
	for _, page := range pages(t) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		inFence := false
		for i, line := range lines {
			m := fenceRE.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			if inFence {
				inFence = false
				continue
			}
			inFence = true
			lang := strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(line), "`~"))
			if !commandFences[lang] {
				continue
			}
			blocks++
			prev := ""
			for j := i - 1; j >= 0; j-- {
				if strings.TrimSpace(lines[j]) != "" {
					prev = strings.TrimSpace(lines[j])
					break
				}
			}
			mm := markerRE.FindStringSubmatch(prev)
			if mm == nil {
				t.Errorf("%s:%d: a %s block without <!-- illustrative --> or <!-- tested: TestName --> on the line before", rel(page), i+1, lang)
				continue
			}
			if mm[1] == "illustrative" {
				continue
			}
			for _, name := range strings.Split(mm[2], ",") {
				name = strings.TrimSpace(name)
				fn, step, _ := strings.Cut(name, "/")
				src, ok := tests[fn]
				if !ok {
					t.Errorf("%s:%d: tested: %s: no func %s in any _test.go", rel(page), i+1, name, fn)
					continue
				}
				if step != "" && !strings.Contains(src, `"`+step+`"`) {
					t.Errorf("%s:%d: tested: %s: no step %q where %s is defined", rel(page), i+1, name, step, fn)
				}
			}
		}
	}
	if blocks == 0 {
		t.Fatal("no command blocks found: the scan lost its way")
	}
}

// testSources maps each Test function of the repository to the source of
// its file.
func testSources(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	funcRE := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "bin" || d.Name() == ".git" || d.Name() == "dist") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range funcRE.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
