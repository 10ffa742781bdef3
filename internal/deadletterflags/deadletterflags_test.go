package deadletterflags

import (
	"strings"
	"testing"
	"time"
)

func TestFilter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	f, err := Selection{Reasons: []string{"database"}, IDs: []string{"a"}, Since: "24h", Until: "2026-12-01T11:00:00Z", Limit: 5}.Filter(now)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Since.Equal(now.Add(-24*time.Hour)) || !f.Until.Equal(now.Add(-time.Hour)) || f.Limit != 5 ||
		len(f.Classes) != 1 || f.Classes[0] != "database" || len(f.MessageIDs) != 1 || f.MessageIDs[0] != "a" {
		t.Errorf("filter = %+v", f)
	}
	if f, err := (Selection{}).Filter(now); err != nil || !f.Since.IsZero() || !f.Until.IsZero() || f.Limit != 0 {
		t.Errorf("empty selection: %+v, %v; want everything, no error", f, err)
	}
	for _, tc := range []struct {
		s    Selection
		want string
	}{
		{Selection{Reasons: []string{"database", "poison"}}, `--reason "poison" is not a reason class`},
		{Selection{IDs: []string{"a", ""}}, "--id must not be empty"},
		{Selection{Limit: -1}, "--limit"},
		{Selection{Since: "yesterday"}, "--since"},
		{Selection{Until: "-5m"}, "--until"},
		{Selection{Since: "1h", Until: "2h"}, "must be before --until"},
	} {
		if _, err := tc.s.Filter(now); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one with %q", tc.s, err, tc.want)
		}
	}
}
