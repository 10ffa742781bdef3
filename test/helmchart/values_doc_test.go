package helmchart

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	readme      = "../../docs/install.md"
	tableBegin  = "<!-- helm-values:begin (generated from charts/idc-operator/values.schema.json by test/helmchart) -->"
	tableEnd    = "<!-- helm-values:end -->"
	regenREADME = "regenerate: IDC_UPDATE_README=1 go test ./test/helmchart -run TestValuesTable"
)

type schemaNode struct {
	Type        any                    `json:"type"`
	Description string                 `json:"description"`
	Properties  map[string]*schemaNode `json:"properties"`
	Enum        []any                  `json:"enum"`
}

// valuesTable renders one row per leaf of values.schema.json: the key, its
// type, its default from values.yaml, and the schema's description. The
// schema is the one place a value is documented.
func valuesTable(t *testing.T) string {
	t.Helper()
	var root schemaNode
	raw, err := os.ReadFile(chartDir + "/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &root); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	var defaults map[string]any
	raw, err = os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &defaults); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	var rows []string
	var walk func(prefix string, n *schemaNode, def any)
	walk = func(prefix string, n *schemaNode, def any) {
		if len(n.Properties) == 0 {
			if n.Description == "" {
				t.Errorf("values.schema.json: %s has no description", prefix)
			}
			rows = append(rows, fmt.Sprintf("| `%s` | %s | %s | %s |", prefix, typeOf(n), defaultOf(def), escape(n.Description)))
			return
		}
		names := make([]string, 0, len(n.Properties))
		for k := range n.Properties {
			names = append(names, k)
		}
		sort.Strings(names)
		defMap, _ := def.(map[string]any)
		for _, k := range names {
			key := k
			if prefix != "" {
				key = prefix + "." + k
			}
			walk(key, n.Properties[k], defMap[k])
		}
	}
	walk("", &root, defaults)
	return strings.Join(append([]string{"| value | type | default | meaning |", "|---|---|---|---|"}, rows...), "\n")
}

func typeOf(n *schemaNode) string {
	s := fmt.Sprint(n.Type)
	if n.Type == nil {
		s = "string or number"
	}
	if len(n.Enum) > 0 {
		var vals []string
		for _, v := range n.Enum {
			vals = append(vals, fmt.Sprint(v))
		}
		s += " (" + strings.Join(vals, ", ") + ")"
	}
	return s
}

func defaultOf(v any) string {
	b, _ := json.Marshal(v)
	s := string(b)
	if s == "null" || s == `""` {
		return "`\"\"`"
	}
	return "`" + s + "`"
}

func escape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func TestValuesTableInREADME(t *testing.T) {
	raw, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	begin, end := strings.Index(doc, tableBegin), strings.Index(doc, tableEnd)
	if begin < 0 || end < begin {
		t.Fatalf("docs/install.md has no %q ... %q block", tableBegin, tableEnd)
	}
	want := valuesTable(t)
	got := strings.TrimSpace(doc[begin+len(tableBegin) : end])
	if got == want {
		return
	}
	if os.Getenv("IDC_UPDATE_README") == "1" {
		doc = doc[:begin+len(tableBegin)] + "\n" + want + "\n" + doc[end:]
		if err := os.WriteFile(readme, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("docs/install.md's values table is not the one values.schema.json gives (%s):\n%s", regenREADME, firstDiff(want, got))
}
