package process

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestParseCgroupLimit(t *testing.T) {
	for in, want := range map[string]int64{
		"max\n":                 0,
		"536870912\n":           512 << 20,
		"9223372036854771712\n": 0, // cgroup v1 without a limit
		"0":                     0,
	} {
		got, err := parseCgroupLimit(in)
		if err != nil || got != want {
			t.Errorf("parseCgroupLimit(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := parseCgroupLimit("lots"); err == nil {
		t.Error("parseCgroupLimit(\"lots\") must fail")
	}
}

// cgroupFixture writes the cgroup v2 and v1 files that content names ("v2",
// "v1") into a fresh directory and returns the paths to read, v2 first, as
// SetMemory reads /sys/fs/cgroup. A file content does not name is absent.
func cgroupFixture(t *testing.T, content map[string]string) []string {
	t.Helper()
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "memory.max"), filepath.Join(dir, "memory", "memory.limit_in_bytes")}
	for i, version := range []string{"v2", "v1"} {
		c, ok := content[version]
		if !ok {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(paths[i]), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(paths[i], []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return paths
}

// restoreCollector puts GOGC and the soft memory limit back as they were.
func restoreCollector(t *testing.T) {
	gc, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() {
		debug.SetGCPercent(gc)
		debug.SetMemoryLimit(limit)
	})
}

// The defaults apply only where the environment is silent, and the soft
// limit follows the container's limit, read from real files.
func TestSetMemory(t *testing.T) {
	restoreCollector(t)
	const gcPercent = 50
	for _, tc := range []struct {
		name      string
		env       map[string]string
		cgroup    map[string]string
		wantGC    int
		wantLimit int64
	}{
		{"no cgroup file", nil, nil, gcPercent, 0},
		// 0.9 of 512Mi and of 256Mi, to the byte.
		{"cgroup v2 limit", nil, map[string]string{"v2": "536870912\n"}, gcPercent, 483183820},
		{"cgroup v2 unlimited", nil, map[string]string{"v2": "max\n"}, gcPercent, 0},
		{"cgroup v1 limit", nil, map[string]string{"v1": "268435456\n"}, gcPercent, 241591910},
		{"cgroup v1 unlimited", nil, map[string]string{"v1": "9223372036854771712\n"}, gcPercent, 0},
		{"v2 read before v1", nil, map[string]string{"v2": "536870912\n", "v1": "268435456\n"}, gcPercent, 483183820},
		{"GOGC and GOMEMLIMIT set", map[string]string{"GOGC": "200", "GOMEMLIMIT": "100MiB"}, map[string]string{"v2": "536870912\n"}, 0, 0},
		{"GOGC set only", map[string]string{"GOGC": "200"}, map[string]string{"v2": "536870912\n"}, 0, 483183820},
	} {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetGCPercent(100)
			debug.SetMemoryLimit(math.MaxInt64)
			m, err := setMemory(gcPercent, func(k string) string { return tc.env[k] }, cgroupFixture(t, tc.cgroup))
			if err != nil || m.GCPercent != tc.wantGC || m.SoftLimit != tc.wantLimit {
				t.Fatalf("setMemory = %+v, %v; want GOGC %d, soft limit %d", m, err, tc.wantGC, tc.wantLimit)
			}
			wantGC, wantLimit := 100, int64(math.MaxInt64) // the values set before: left alone
			if tc.wantGC != 0 {
				wantGC = tc.wantGC
			}
			if tc.wantLimit != 0 {
				wantLimit = tc.wantLimit
			}
			if got := debug.SetGCPercent(100); got != wantGC {
				t.Errorf("GOGC in force %d, want %d", got, wantGC)
			}
			if got := debug.SetMemoryLimit(-1); got != wantLimit {
				t.Errorf("soft memory limit in force %d, want %d", got, wantLimit)
			}
		})
	}
}

// A cgroup file that cannot be read or parsed is reported, naming the file,
// and the process goes on: GOGC set, no soft limit.
func TestSetMemoryUnreadableLimit(t *testing.T) {
	restoreCollector(t)
	garbled := cgroupFixture(t, map[string]string{"v2": "lots\n", "v1": "268435456\n"})
	// A directory where the v2 file should be: it exists and cannot be read.
	unreadable := cgroupFixture(t, map[string]string{"v1": "268435456\n"})
	if err := os.Mkdir(unreadable[0], 0o755); err != nil {
		t.Fatal(err)
	}
	for name, files := range map[string][]string{"garbled": garbled, "unreadable": unreadable} {
		t.Run(name, func(t *testing.T) {
			debug.SetGCPercent(100)
			debug.SetMemoryLimit(math.MaxInt64)
			m, err := setMemory(50, func(string) string { return "" }, files)
			if err == nil || !strings.Contains(err.Error(), files[0]) {
				t.Fatalf("setMemory error %v; want one naming %s", err, files[0])
			}
			if m.GCPercent != 50 || m.SoftLimit != 0 {
				t.Errorf("setMemory = %+v; want GOGC 50 and no soft limit", m)
			}
			if got := debug.SetGCPercent(100); got != 50 {
				t.Errorf("GOGC in force %d, want 50", got)
			}
			if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
				t.Errorf("soft memory limit in force %d, want none", got)
			}
		})
	}
}
