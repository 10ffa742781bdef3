package extract

import (
	"testing"

	"github.com/tidwall/gjson"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// topLevelBodies are payloads whose top-level members the index must read
// exactly as gjson does: repeated names, escapes in names and values,
// nesting with brackets inside strings, every literal, odd whitespace.
var topLevelBodies = []string{
	`{"id":"a","n":1,"s":"x\"y","o":{"n":2},"arr":[1,2]}`,
	`{"id":"first","id":"second"}`,
	`{"a*":1,"@this":2,"a.b":3,"esc\u0061ped":4}`,
	`[{"id":"in-array"}]`,
	`"just a string"`,
	`{}`,
	` { "id" : "sp" ,	"n":-1.5e+3 ,"t":true,"f":false,"z":null,"u":"\u00e9\n","o":{"s":"}]\"{["},"arr":[{"a":[]},"]"] } `,
	`{"n":0,"big":123456789012345678901234567890,"neg":-0,"frac":0.000001}`,
	"{\"id\"\n:\r\n\"crlf\",\"x\":[ ] ,\"y\":{ }}",
	`{"\"q\"":1,"back\\slash":"v\\","s":""}`,
}

var topLevelNames = []string{"id", "n", "s", "o", "arr", "a*", "@this", "escaped", "missing", "t", "f", "z", "u", "big", "neg", "frac", "x", "y", `"q"`, `back\slash`}

// The one-pass top-level index answers exactly as a gjson lookup of the
// escaped path does: the same type, raw text and string value.
func TestTopLevelIndexMatchesGJSON(t *testing.T) {
	for _, body := range topLevelBodies {
		for _, name := range topLevelNames {
			checkTopLevel(t, body, name)
		}
	}
	if e := MustCompile("$.o.n"); e.top != "" {
		t.Errorf("a nested path used the top-level index: %q", e.top)
	}
}

func checkTopLevel(t *testing.T, body, name string) {
	t.Helper()
	m := NewMessage(source.Message{Body: []byte(body)})
	if !m.ValidJSON() {
		t.Fatalf("test body is not JSON: %s", body)
	}
	want := gjson.Get(body, gjson.Escape(name))
	got := m.topLevel(name)
	if got.Exists() != want.Exists() || got.Type != want.Type || got.Raw != want.Raw || got.Str != want.Str {
		t.Errorf("%q in %s: index %v %q %q (exists %v), gjson %v %q %q (exists %v)", name, body,
			got.Type, got.Raw, got.Str, got.Exists(), want.Type, want.Raw, want.Str, want.Exists())
	}
}

// FuzzTopLevelIndex compares the index with gjson on any valid JSON object,
// for each of its member names (go test runs the seed corpus; go test
// -fuzz FuzzTopLevelIndex searches further).
func FuzzTopLevelIndex(f *testing.F) {
	for _, b := range topLevelBodies {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body string) {
		if !gjson.Valid(body) {
			return
		}
		names := map[string]bool{"missing": true}
		gjson.Parse(body).ForEach(func(k, _ gjson.Result) bool {
			names[k.Str] = true
			return true
		})
		for name := range names {
			if name == "" {
				continue // "$." is not an expression
			}
			checkTopLevel(t, body, name)
		}
	})
}

func TestCanonicalNumberFastPath(t *testing.T) {
	for raw, want := range map[string]string{"0": "0", "-0": "0", "42": "42", "-7": "-7", "1e3": "1000", "1000.0": "1000", "2.5": "2.5",
		"123456789012345678901234567890": "123456789012345678901234567890"} {
		if got := CanonicalNumber(raw); got != want {
			t.Errorf("CanonicalNumber(%s) = %s, want %s", raw, got, want)
		}
	}
}

// BenchmarkTopLevelEvent reads what the loop reads from a typical event:
// the id, the entity key, its version and two columns.
func BenchmarkTopLevelEvent(b *testing.B) {
	body := []byte(`{"id":"k00042-v3","key":"k00042","version":3,"status":"s3","amount":423}`)
	exprs := []Expr{MustCompile("$.id"), MustCompile("$.key"), MustCompile("$.version"), MustCompile("$.status"), MustCompile("$.amount")}
	b.ReportAllocs()
	for b.Loop() {
		m := NewMessage(source.Message{Body: body})
		for _, e := range exprs {
			if _, err := e.Text(m); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// NewMessages gives each message its own room: indexing one never
// overwrites another's members, also past the reserved room.
func TestNewMessagesKeepMembersApart(t *testing.T) {
	wide := `{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"id":"wide"}`
	bodies := []string{`{"id":"one","n":1}`, wide, `{"id":"three","n":3}`, wide}
	ms := make([]source.Message, len(bodies))
	for i, b := range bodies {
		ms[i] = source.Message{Body: []byte(b)}
	}
	msgs := NewMessages(ms)
	id := MustCompile("$.id")
	for _, i := range []int{3, 0, 1, 2} { // out of order
		want := gjson.Get(bodies[i], "id").Str
		if got, err := id.Text(&msgs[i]); err != nil || got != want {
			t.Errorf("message %d: id %q, %v; want %q", i, got, err, want)
		}
	}
	for i := range msgs {
		want := gjson.Get(bodies[i], "id").Str
		if got, _ := id.Text(&msgs[i]); got != want {
			t.Errorf("message %d after the others were indexed: id %q, want %q", i, got, want)
		}
	}
}
