package extract

import (
	"errors"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

func msg(body string) *Message {
	return NewMessage(source.Message{
		NativeID:    "ORDERS:42",
		Headers:     map[string]string{"Nats-Msg-Id": "h-1", "Empty": ""},
		Body:        []byte(body),
		PublishedAt: time.Date(2024, 5, 6, 7, 8, 9, 123000000, time.UTC),
	})
}

func TestGJSONPath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"$", "@this"},
		{"$.a", "a"},
		{"$.a.b", "a.b"},
		{"$.items.0.id", "items.0.id"},
		{"$.a*.b?", `a\*.b\?`},
		{"$.@this.x|y", `\@this.x\|y`},
		{"$.#.k", `\#.k`},
	} {
		if got := GJSONPath(tc.in); got != tc.want {
			t.Errorf("GJSONPath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestExprText(t *testing.T) {
	const body = `{"id":"abc","n":42,"big":123456789012345678901234567890,"exp":1e3,"f":1.50,"neg":-0,` +
		`"nil":null,"obj":{"k":[1,2]},"a*":"star","@this":"lit","esc":"q\"uote","arr":[{"id":7}]}`
	m := msg(body)
	m.ID = "mid-1"
	for _, tc := range []struct {
		expr, want string
		err        error
	}{
		{"$.id", "abc", nil},
		{"$.n", "42", nil},
		{"$.big", "123456789012345678901234567890", nil},
		{"$.exp", "1000", nil},
		{"$.f", "1.5", nil},
		{"$.neg", "0", nil},
		{"$.obj", `{"k":[1,2]}`, nil},
		{"$.a*", "star", nil},
		{"$.@this", "lit", nil},
		{"$.esc", `q"uote`, nil},
		{"$.arr.0.id", "7", nil},
		{"$.nope", "", ErrMissing},
		{"$.obj.k.5", "", ErrMissing},
		{"$.nil", "", ErrMissing},
		{"@messageId", "mid-1", nil},
		{"@publishedAt", "2024-05-06T07:08:09.123Z", nil},
		{"@header:Nats-Msg-Id", "h-1", nil},
		{"@header:nats-msg-id", "h-1", nil},
		{"@header:Missing", "", ErrMissing},
	} {
		got, err := MustCompile(tc.expr).Text(m)
		if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
			t.Errorf("%s: err = %v, want %v", tc.expr, err, tc.err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

func TestExprJSONAndParam(t *testing.T) {
	m := msg(`{"s":"x","n":12.50,"nil":null,"o":{"a":1}}`)
	m.ID = "id-9"
	for _, tc := range []struct {
		expr, json string
		param      any
	}{
		{"$.s", `"x"`, "x"},
		{"$.n", `12.50`, "12.50"},
		{"$.nil", `null`, nil},
		{"$.o", `{"a":1}`, `{"a":1}`},
		{"@messageId", `"id-9"`, "id-9"},
		{"@payload", `{"s":"x","n":12.50,"nil":null,"o":{"a":1}}`, `{"s":"x","n":12.50,"nil":null,"o":{"a":1}}`},
		{"@header:Empty", `""`, ""},
	} {
		e := MustCompile(tc.expr)
		j, err := e.JSON(m)
		if err != nil || string(j) != tc.json {
			t.Errorf("%s JSON = %s, %v; want %s", tc.expr, j, err, tc.json)
		}
		p, err := e.Param(m)
		if err != nil || p != tc.param {
			t.Errorf("%s Param = %#v, %v; want %#v", tc.expr, p, err, tc.param)
		}
	}
}

func TestInvalidJSON(t *testing.T) {
	m := msg(`{"id": "abc"`)
	for _, expr := range []string{"$.id", "$", "@payload"} {
		if _, err := MustCompile(expr).JSON(m); !errors.Is(err, ErrInvalidJSON) {
			t.Errorf("%s on invalid JSON: err = %v, want ErrInvalidJSON", expr, err)
		}
	}
	if _, err := MustCompile("@header:Nats-Msg-Id").Text(m); err != nil {
		t.Errorf("a header must not need a JSON payload: %v", err)
	}
	if ErrInvalidJSON.Error() != "invalid JSON payload" {
		t.Errorf("the dead-letter reason text changed: %q", ErrInvalidJSON)
	}
}

func TestCompileRejects(t *testing.T) {
	for _, expr := range []string{"", "a.b", "$..a", "@header:", "@nope"} {
		if _, err := Compile(expr); err == nil {
			t.Errorf("Compile(%q) succeeded, want an error", expr)
		}
	}
}

func TestExtractor(t *testing.T) {
	m := msg(`{"eventId":"e-1","num":77,"v":"12","bad":"x","empty":""}`)
	for _, tc := range []struct {
		name string
		x    config.Extractor
		want string
		err  error
	}{
		{"header", config.Extractor{Header: "Nats-Msg-Id"}, "h-1", nil},
		{"json", config.Extractor{JSONPath: "$.eventId"}, "e-1", nil},
		{"number id is canonical text", config.Extractor{JSONPath: "$.num"}, "77", nil},
		{"native", config.Extractor{BrokerNative: true}, "ORDERS:42", nil},
		{"missing", config.Extractor{JSONPath: "$.other"}, "", ErrMissing},
		{"empty string", config.Extractor{JSONPath: "$.empty"}, "", ErrMissing},
		{"empty header", config.Extractor{Header: "Empty"}, "", ErrMissing},
	} {
		x, err := CompileExtractor(tc.x)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, err := x.Text(m)
		if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) || got != tc.want {
			t.Errorf("%s: got %q, %v; want %q, %v", tc.name, got, err, tc.want, tc.err)
		}
	}
	seq := func(path string) (int64, error) {
		x, err := CompileExtractor(config.Extractor{JSONPath: path})
		if err != nil {
			t.Fatal(err)
		}
		return x.Int(m)
	}
	if n, err := seq("$.num"); n != 77 || err != nil {
		t.Errorf("Int($.num) = %d, %v", n, err)
	}
	if n, err := seq("$.v"); n != 12 || err != nil {
		t.Errorf("Int($.v) = %d, %v (a string holding an integer is accepted)", n, err)
	}
	if _, err := seq("$.bad"); !errors.Is(err, ErrNotInteger) {
		t.Errorf("Int($.bad) err = %v, want ErrNotInteger", err)
	}
	native := NewMessage(source.Message{})
	x, _ := CompileExtractor(config.Extractor{BrokerNative: true})
	if _, err := x.Text(native); !errors.Is(err, ErrMissing) {
		t.Errorf("empty native id: err = %v, want ErrMissing", err)
	}
	if _, err := CompileExtractor(config.Extractor{}); err == nil {
		t.Error("an empty extractor must not compile")
	}
	if _, err := CompileExtractor(config.Extractor{JSONPath: "@payload"}); err == nil {
		t.Error("jsonPath must be a JSON path")
	}
}
