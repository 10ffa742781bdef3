// Package errtext makes the text of an error from outside (a database, a
// broker, an HTTP server) fit for status conditions and events: anything
// that looks like a credential is redacted, server replies quoted in it are
// withheld, control characters go, and the length is bounded. Status is
// readable by everyone with view rights on the resource, often across
// namespaces and NetworkPolicies: it must not become a way to read another
// host's banner or a password.
package errtext

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxLen bounds the sanitized text, in bytes.
const MaxLen = 256

// maxQuoted is the longest quoted text kept as it is: an SQL identifier
// (63 bytes) fits; a server's banner or reply does not.
const maxQuoted = 64

var (
	// userinfo of a URL: scheme://user:password@
	urlPassword = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^:@/\s]*):[^@/\s]*@`)
	// password=..., in key=value connection strings
	kvPassword = regexp.MustCompile(`(?i)(password|passwd|pwd|secret|token)=("[^"]*"|'[^']*'|\S+)`)
	// "...", '...' and `...`
	quoted = regexp.MustCompile("\"[^\"]*\"|'[^']*'|`[^`]*`")
)

// Sanitize returns s (an external error's text) with credentials redacted,
// quoted server text longer than an identifier or holding spaces withheld,
// control and non-printing characters replaced by spaces, runs of spaces
// collapsed, and cut to MaxLen bytes (on a rune boundary, marked with …).
func Sanitize(s string) string {
	s = strings.ToValidUTF8(s, " ")
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, s)
	s = urlPassword.ReplaceAllString(s, "$1:xxxxx@")
	s = kvPassword.ReplaceAllString(s, "$1=<redacted>")
	s = quoted.ReplaceAllStringFunc(s, func(q string) string {
		inner := q[1 : len(q)-1]
		if len(inner) > maxQuoted || strings.ContainsFunc(inner, unicode.IsSpace) {
			return q[:1] + "<server text withheld>" + q[:1]
		}
		return q
	})
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= MaxLen {
		return s
	}
	cut := MaxLen - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Of is Sanitize(err.Error()), and "" for a nil error.
func Of(err error) string {
	if err == nil {
		return ""
	}
	return Sanitize(err.Error())
}
