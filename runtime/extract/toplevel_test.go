package extract

import (
	"testing"

	"github.com/tidwall/gjson"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// The one-pass top-level index answers exactly as a gjson lookup of the
// escaped path does, repeated names and odd keys included.
func TestTopLevelIndexMatchesGJSON(t *testing.T) {
	bodies := []string{
		`{"id":"a","n":1,"s":"x\"y","o":{"n":2},"arr":[1,2]}`,
		`{"id":"first","id":"second"}`,
		`{"a*":1,"@this":2,"a.b":3,"esc\u0061ped":4}`,
		`[{"id":"in-array"}]`,
		`"just a string"`,
		`{}`,
	}
	names := []string{"id", "n", "s", "o", "arr", "a*", "@this", "escaped", "missing"}
	for _, body := range bodies {
		for _, name := range names {
			e := MustCompile("$." + name)
			m := NewMessage(source.Message{Body: []byte(body)})
			want := gjson.Get(body, GJSONPath("$."+name))
			got := m.topLevel(e.top)
			if e.top != name || got.Exists() != want.Exists() || got.Raw != want.Raw {
				t.Errorf("%s in %s: index %q (exists %v), gjson %q (exists %v)", name, body, got.Raw, got.Exists(), want.Raw, want.Exists())
			}
		}
	}
	if e := MustCompile("$.o.n"); e.top != "" {
		t.Errorf("a nested path used the top-level index: %q", e.top)
	}
}

func TestCanonicalNumberFastPath(t *testing.T) {
	for raw, want := range map[string]string{"0": "0", "-0": "0", "42": "42", "-7": "-7", "1e3": "1000", "1000.0": "1000", "2.5": "2.5",
		"123456789012345678901234567890": "123456789012345678901234567890"} {
		if got := CanonicalNumber(raw); got != want {
			t.Errorf("CanonicalNumber(%s) = %s, want %s", raw, got, want)
		}
	}
}
