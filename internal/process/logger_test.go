package process

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// debug shows V(1); info does not; another level is an error with a usable
// logger.
func TestNewLogger(t *testing.T) {
	for _, tc := range []struct {
		level     string
		wantLines int
		wantErr   bool
	}{{"", 1, false}, {"info", 1, false}, {"debug", 2, false}, {"trace", 1, true}} {
		var buf bytes.Buffer
		log, err := NewLogger(tc.level, &buf)
		if (err != nil) != tc.wantErr {
			t.Fatalf("level %q: error %v, want error %v", tc.level, err, tc.wantErr)
		}
		log.Info("shown", "k", "v")
		log.V(1).Info("detail")
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != tc.wantLines {
			t.Fatalf("level %q: %d lines, want %d:\n%s", tc.level, len(lines), tc.wantLines, buf.String())
		}
		var first map[string]any
		if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || first["msg"] != "shown" || first["k"] != "v" {
			t.Errorf("level %q: first line %q is not the JSON record (%v)", tc.level, lines[0], err)
		}
	}
}
