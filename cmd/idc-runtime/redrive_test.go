package main

import (
	"strings"
	"testing"
	"time"
)

func TestRedriveOptions(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	good := redriveFlags{reasons: stringList{"database"}, ids: stringList{"a"}, since: "24h", until: "2026-12-01T11:00:00Z", limit: 5}
	opts, err := good.options(now)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Run != "cli-20261201T120000Z" || !opts.Filter.Since.Equal(now.Add(-24*time.Hour)) ||
		opts.Filter.Until.Hour() != 11 || opts.Filter.Limit != 5 || opts.Filter.Classes[0] != "database" || opts.Filter.MessageIDs[0] != "a" {
		t.Errorf("options = %+v", opts)
	}
	bad := []struct {
		f    redriveFlags
		want string
	}{
		{redriveFlags{reasons: stringList{"poison"}}, "--reason"},
		{redriveFlags{limit: -1}, "--limit"},
		{redriveFlags{since: "yesterday"}, "--since"},
		{redriveFlags{until: "-5m"}, "--until"},
		{redriveFlags{since: "1h", until: "2h"}, "must be before --until"},
	}
	for _, tc := range bad {
		if _, err := tc.f.options(now); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one naming %s", tc.f, err, tc.want)
		}
	}
}

func TestRedriveUsageErrors(t *testing.T) {
	var out, errOut strings.Builder
	if code := dispatch([]string{"redrive"}, &out, &errOut); code != exitUsage {
		t.Errorf("redrive without --config: exit %d, want %d", code, exitUsage)
	}
	if code := dispatch([]string{"redrive", "--limit", "x"}, &out, &errOut); code != exitUsage {
		t.Errorf("redrive --limit x: exit %d, want %d", code, exitUsage)
	}
}
