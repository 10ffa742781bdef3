package main

import (
	"io/fs"
	"math"
	"runtime/debug"
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

// The defaults apply only where the environment is silent, and the soft
// limit follows the container's limit.
func TestMemorySettings(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	files := map[string]string{"/sys/fs/cgroup/memory.max": "536870912\n"}
	read := func(p string) ([]byte, error) {
		if v, ok := files[p]; ok {
			return []byte(v), nil
		}
		return nil, fs.ErrNotExist
	}
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }

	var containerLimit int64 = 512 << 20
	gc, limit, err := memorySettings(getenv, read)
	if err != nil || gc != defaultGCPercent || limit != int64(float64(containerLimit)*softLimitRatio) {
		t.Fatalf("no GOGC, no GOMEMLIMIT, 512Mi limit: gc %d, soft limit %d, %v", gc, limit, err)
	}
	if got := debug.SetGCPercent(100); got != defaultGCPercent {
		t.Fatalf("GOGC in force %d, want %d", got, defaultGCPercent)
	}
	if got := debug.SetMemoryLimit(-1); got != limit {
		t.Fatalf("soft memory limit in force %d, want %d", got, limit)
	}

	env["GOGC"], env["GOMEMLIMIT"] = "200", "100MiB"
	debug.SetMemoryLimit(math.MaxInt64)
	gc, limit, err = memorySettings(getenv, read)
	if err != nil || gc != 0 || limit != 0 {
		t.Fatalf("GOGC and GOMEMLIMIT set: gc %d, soft limit %d, %v; want both left alone", gc, limit, err)
	}
	if got := debug.SetGCPercent(100); got != 100 {
		t.Fatalf("GOGC changed to %d though the environment set it", got)
	}

	delete(env, "GOMEMLIMIT")
	delete(files, "/sys/fs/cgroup/memory.max")
	if _, limit, err = memorySettings(getenv, read); err != nil || limit != 0 {
		t.Fatalf("no cgroup file: soft limit %d, %v; want none", limit, err)
	}
}
