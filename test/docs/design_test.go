package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// codeRoots are the trees whose every Go package docs/design.md describes.
var codeRoots = []string{"api", "cmd", "controllers", "internal", "runtime"}

// designPathRE finds a path into the code in docs/design.md: in backticks,
// starting at one of the repository's top-level directories.
var designPathRE = regexp.MustCompile("`((?:api|cmd|controllers|internal|runtime|test|hack|config|charts)/[A-Za-z0-9_./-]*)`")

// designPhaseRE finds a phase in docs/design.md's phase table: a row whose
// first cell is a number and whose second is the phase's name in backticks.
var designPhaseRE = regexp.MustCompile("(?m)^\\| *[0-9]+ *\\| *`([a-z-]+)` *\\|")

func readDesign(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDesignNamesWhatExists: every path docs/design.md names exists, and
// every Go package of the code trees is named there.
func TestDesignNamesWhatExists(t *testing.T) {
	design := readDesign(t)
	named := map[string]bool{}
	for _, m := range designPathRE.FindAllStringSubmatch(design, -1) {
		p := strings.TrimSuffix(m[1], "/")
		named[p] = true
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("docs/design.md names `%s`, which does not exist", m[1])
		}
	}
	for _, pkg := range goPackages(t) {
		if !named[pkg] {
			t.Errorf("package %s is not described in docs/design.md (name it as `%s/`)", pkg, pkg)
		}
	}
}

// goPackages lists the directories under codeRoots holding non-test Go
// files, testdata and generated-only directories aside.
func goPackages(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, r := range codeRoots {
		err := filepath.WalkDir(filepath.Join(root, r), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.HasPrefix(d.Name(), "zz_generated") {
				return nil
			}
			out = append(out, filepath.ToSlash(rel(filepath.Dir(p))))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestDesignListsEveryPhase: docs/design.md's phase table lists the
// reconciler's phases, all of them, in the order controllers runs them.
func TestDesignListsEveryPhase(t *testing.T) {
	var documented []string
	for _, m := range designPhaseRE.FindAllStringSubmatch(readDesign(t), -1) {
		documented = append(documented, m[1])
	}
	code := reconcilerPhases(t)
	if len(code) < 10 {
		t.Fatalf("found only %d phases in controllers (%v): has the phase list moved?", len(code), code)
	}
	if !slices.Equal(documented, code) {
		t.Errorf("docs/design.md's phase table lists %v; controllers runs %v", documented, code)
	}
}

// reconcilerPhases reads the phase names, in order, from the function in
// controllers that returns []phase: each element is {"name", r.fn}.
func reconcilerPhases(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(root, "controllers", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			arr, ok := lit.Type.(*ast.ArrayType)
			if !ok {
				return true
			}
			if id, ok := arr.Elt.(*ast.Ident); !ok || id.Name != "phase" {
				return true
			}
			for _, e := range lit.Elts {
				el, ok := e.(*ast.CompositeLit)
				if !ok || len(el.Elts) == 0 {
					continue
				}
				first := el.Elts[0]
				if kv, ok := first.(*ast.KeyValueExpr); ok {
					first = kv.Value
				}
				if bl, ok := first.(*ast.BasicLit); ok && bl.Kind == token.STRING {
					if s, err := strconv.Unquote(bl.Value); err == nil {
						names = append(names, s)
					}
				}
			}
			return false
		})
	}
	return names
}
