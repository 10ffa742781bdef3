// Package docs tests the documentation as a newcomer meets it: the README is
// a short front door, every link between README.md and docs/ resolves (files
// and #anchors), the generated API reference covers every field of the CRD,
// and every command block is either run by a named test or marked as
// illustrative.
package docs

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const root = "../.."

// pages are the documents whose links are checked: the README and the
// hand-written pages of docs/ (the generated reference is a link target; its
// own links are crd-ref-docs').
func pages(t *testing.T) []string {
	t.Helper()
	out := []string{filepath.Join(root, "README.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p == filepath.Join(root, "docs", "reference") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	fenceRE   = regexp.MustCompile("^\\s*(```|~~~)")
)

// anchor is GitHub's heading anchor: lower case, spaces to '-', every
// character but letters, digits, '-' and '_' dropped.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors lists the anchors of a markdown file's headings (outside code
// blocks), numbered as GitHub numbers repeated ones.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out, seen := map[string]bool{}, map[string]int{}
	inFence := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if fenceRE.MatchString(line) {
			inFence = !inFence
			continue
		}
		m := headingRE.FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		text := regexp.MustCompile("`|\\*\\*|\\[([^]]*)\\]\\([^)]*\\)").ReplaceAllString(m[2], "$1")
		a := anchor(text)
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestLinksResolve checks every relative link of README.md and docs/: the
// file exists, and a #anchor into a markdown file names one of its headings.
func TestLinksResolve(t *testing.T) {
	cache := map[string]map[string]bool{}
	for _, page := range pages(t) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		inFence := false
		for i, line := range strings.Split(string(b), "\n") {
			if fenceRE.MatchString(line) {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, frag, _ := strings.Cut(target, "#")
				resolved := page
				if file != "" {
					resolved = filepath.Join(filepath.Dir(page), file)
					if _, err := os.Stat(resolved); err != nil {
						t.Errorf("%s:%d: link %q: %v", rel(page), i+1, target, err)
						continue
					}
				}
				if frag == "" || !strings.HasSuffix(resolved, ".md") {
					continue
				}
				if cache[resolved] == nil {
					cache[resolved] = anchors(t, resolved)
				}
				if !cache[resolved][frag] {
					t.Errorf("%s:%d: link %q: no heading #%s in %s", rel(page), i+1, target, frag, rel(resolved))
				}
			}
		}
	}
}

func rel(p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return r
}

// maxREADMELines keeps the README a front door: what it is, the two
// commands, a first resource, the guarantees, the picture, and links into
// docs/. Everything else lives in docs/.
const maxREADMELines = 160

func TestREADMEIsAFrontDoor(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	n := strings.Count(string(b), "\n")
	if n > maxREADMELines {
		t.Errorf("README.md has %d lines, more than %d: move the detail into docs/ and link to it", n, maxREADMELines)
	}
	for _, want := range []string{"## The two commands", "## A first resource", "## What it guarantees", "## Architecture", "## Performance", "## Documentation"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("README.md lacks the section %q", want)
		}
	}
	for i, line := range strings.Split(string(b), "\n") {
		if m := notInTheREADME.FindString(line); m != "" {
			t.Errorf("README.md:%d says %q: machine notes go to docs/development.md, run logs and history to docs/benchmarks.md", i+1, m)
		}
	}
}

// notInTheREADME: a machine note (this machine, its cores, its Go, what it
// can download) or an internal issue or session number.
var notInTheREADME = regexp.MustCompile(`(?i)\bthis machine\b|\b\d+ cores\b|\bgo 1\.26|can(not|'t) be downloaded|\bissue #?\d+|\bsession \d+`)
