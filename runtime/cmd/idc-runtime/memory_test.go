package main

import (
	"io/fs"
	"runtime/debug"
	"testing"
)

func TestConsumerMemorySettings(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	env := func(vals map[string]string) func(string) string { return func(k string) string { return vals[k] } }
	files := func(content map[string]string) func(string) ([]byte, error) {
		return func(p string) ([]byte, error) {
			if c, ok := content[p]; ok {
				return []byte(c), nil
			}
			return nil, fs.ErrNotExist
		}
	}
	for _, tc := range []struct {
		name      string
		env       map[string]string
		files     map[string]string
		wantGC    int
		wantLimit int64
	}{
		{"defaults, no limit", nil, nil, runGCPercent, 0},
		{"cgroup v2 limit", nil, map[string]string{"/sys/fs/cgroup/memory.max": "268435456\n"}, runGCPercent, 241591910},
		{"cgroup v2 unlimited", nil, map[string]string{"/sys/fs/cgroup/memory.max": "max\n"}, runGCPercent, 0},
		{"cgroup v1 unlimited", nil, map[string]string{"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"}, runGCPercent, 0},
		{"GOGC and GOMEMLIMIT set", map[string]string{"GOGC": "100", "GOMEMLIMIT": "1GiB"}, map[string]string{"/sys/fs/cgroup/memory.max": "268435456"}, 0, 0},
	} {
		gc, limit := consumerMemorySettings(env(tc.env), files(tc.files))
		if gc != tc.wantGC || limit != tc.wantLimit {
			t.Errorf("%s: GOGC %d, soft limit %d; want %d, %d", tc.name, gc, limit, tc.wantGC, tc.wantLimit)
		}
	}
}
