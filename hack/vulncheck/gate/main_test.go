package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const stream = `{"config":{"protocol_version":"v1.0.0"}}
{"finding":{"osv":"GO-2026-0001","fixed_version":"v1.2.0","trace":[{"module":"example.com/a","version":"v1.1.0","package":"example.com/a/x"}]}}
{"finding":{"osv":"GO-2026-0002","fixed_version":"v0.9.0","trace":[{"module":"example.com/b","version":"v0.8.0","package":"example.com/b","function":"Parse"},{"module":"m","package":"m/main","function":"main"}]}}
{"finding":{"osv":"GO-2026-0003","fixed_version":"go1.27.4","trace":[{"module":"stdlib","version":"v1.27.3","package":"net/http","function":"Do","receiver":"*Client"},{"module":"m","package":"m/main","function":"run"}]}}
`

func gate(t *testing.T, allowList string) (int, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "allow.txt")
	if err := os.WriteFile(path, []byte(allowList), 0o600); err != nil {
		t.Fatal(err)
	}
	allowed, err := readAllowList(path)
	if err != nil {
		t.Fatal(err)
	}
	found, imported, err := readFindings(strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	return report(&out, "test", found, imported, allowed), out.String()
}

func TestCalledVulnerabilityFailsUnlessAllowed(t *testing.T) {
	code, out := gate(t, "# none\n")
	if code != 1 || !strings.Contains(out, "CALLED  GO-2026-0002") || !strings.Contains(out, "CALLED  GO-2026-0003") ||
		!strings.Contains(out, "net/http.Client.Do <- m/main.run") {
		t.Fatalf("code %d, output:\n%s", code, out)
	}
	if !strings.Contains(out, "2 called (0 allowed, 2 not allowed), 1 imported") {
		t.Fatalf("summary: %s", out)
	}
	code, out = gate(t, "GO-2026-0002 no fixed release of example.com/b yet\nGO-2026-0003 go1.27.4 is not on the proxy\n")
	if code != 0 || !strings.Contains(out, "ALLOWED GO-2026-0002") || !strings.Contains(out, ": no fixed release of example.com/b yet") {
		t.Fatalf("code %d, output:\n%s", code, out)
	}
}

func TestAllowListEntryNeedsAReason(t *testing.T) {
	path := filepath.Join(t.TempDir(), "allow.txt")
	if err := os.WriteFile(path, []byte("GO-2026-0002\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readAllowList(path); err == nil || !strings.Contains(err.Error(), "has no reason") {
		t.Fatalf("want a missing-reason error, got %v", err)
	}
}
