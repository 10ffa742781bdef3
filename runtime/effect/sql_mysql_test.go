package effect

import (
	"strings"
	"testing"
)

func TestConvertNamedParamsMySQL(t *testing.T) {
	for _, tc := range []struct {
		in, out string
		names   []string
	}{
		{"UPDATE a SET b = :b WHERE id = :id AND c = :b", "UPDATE a SET b = ? WHERE id = ? AND c = ?", []string{"b", "id", "b"}},
		{`SELECT ':x', 'it''s :y', 'a\' :z', ":q", "\" :r", :w`, `SELECT ':x', 'it''s :y', 'a\' :z', ":q", "\" :r", ?`, []string{"w"}},
		{"SELECT `:col`, `a``:b` FROM t # :c0\n-- :c1\nWHERE /* :c2 */ a = :a", "SELECT `:col`, `a``:b` FROM t # :c0\n-- :c1\nWHERE /* :c2 */ a = ?", []string{"a"}},
		// --x is not a comment in MySQL (minus minus x), so :p there is a parameter.
		{"SELECT 1 --:p", "SELECT 1 --?", []string{"p"}},
		{"SET @x := :v", "SET @x := ?", []string{"v"}},
		{"SELECT '$1', $x, :n", "SELECT '$1', $x, ?", []string{"n"}},
	} {
		out, names, err := ConvertNamedParamsMySQL(tc.in)
		if err != nil || out != tc.out || strings.Join(names, ",") != strings.Join(tc.names, ",") {
			t.Errorf("ConvertNamedParamsMySQL(%q) = %q %v %v; want %q %v", tc.in, out, names, err, tc.out, tc.names)
		}
	}
	for _, bad := range []string{"SELECT ?", "SELECT 'open", `SELECT "open`, "SELECT `open", "SELECT /* open"} {
		if _, _, err := ConvertNamedParamsMySQL(bad); err == nil {
			t.Errorf("ConvertNamedParamsMySQL(%q) succeeded, want an error", bad)
		}
	}
}
