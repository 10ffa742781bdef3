package errtext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSanitize(t *testing.T) {
	banner := "SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13 " + strings.Repeat("BANNER ", 200)
	for _, tc := range []struct {
		name, in   string
		want       string
		mustNot    []string
		mustAlso   []string
		exactMatch bool
	}{
		{name: "a reply quoted in the error is withheld", in: `while reading: redis: can't parse map reply: "` + banner[:100] + `"`,
			mustNot: []string{"SSH-2.0", "BANNER"}, mustAlso: []string{`can't parse map reply: "<server text withheld>"`}},
		{name: "an identifier stays", in: `ERROR: relation "app.orders" does not exist (SQLSTATE 42P01)`,
			want: `ERROR: relation "app.orders" does not exist (SQLSTATE 42P01)`, exactMatch: true},
		{name: "URL password", in: "dial amqp://guest:s3cret@mq:5672/ failed", mustNot: []string{"s3cret"}, mustAlso: []string{"amqp://guest:xxxxx@mq:5672/"}},
		{name: "key=value password", in: "cannot parse `host=db password=s3cret user=app`: bad", mustNot: []string{"s3cret"}},
		{name: "control characters and newlines", in: "line one\r\nline\x00two\x1b[31m", want: "line one line two [31m", exactMatch: true},
		{name: "an unquoted banner is cut to the bound", in: "unexpected reply " + banner, mustAlso: []string{"…"}},
		{name: "invalid UTF-8", in: "bad \xff\xfe bytes", want: "bad bytes", exactMatch: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Sanitize(tc.in)
			if len(got) > MaxLen || !utf8.ValidString(got) {
				t.Fatalf("%d bytes (valid UTF-8: %v), want at most %d: %q", len(got), utf8.ValidString(got), MaxLen, got)
			}
			if tc.exactMatch && got != tc.want {
				t.Fatalf("Sanitize = %q, want %q", got, tc.want)
			}
			for _, s := range tc.mustNot {
				if strings.Contains(got, s) {
					t.Errorf("%q still holds %q", got, s)
				}
			}
			for _, s := range tc.mustAlso {
				if !strings.Contains(got, s) {
					t.Errorf("%q lacks %q", got, s)
				}
			}
		})
	}
}
