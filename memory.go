package main

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"runtime/debug"
	"strconv"
	"strings"
)

// defaultGCPercent is the manager's GOGC when the environment sets none. Its
// live heap is small (about 30 MiB with 1,000 resources) and mostly idle, so
// the collector's default of 100 (a heap allowed to reach twice the live
// data) is what sizes its memory; 50 keeps the peak resident size about 15
// MiB lower at 1,000 resources for a few percent more CPU during a burst of
// creations. Prometheus picks its own GOGC the same way.
const defaultGCPercent = 50

// softLimitRatio is the share of the container's memory limit the Go
// runtime is asked to stay under (GOMEMLIMIT), leaving room for what it does
// not count (the binary's mapped pages, C stacks): near the limit the
// collector works harder instead of the kernel killing the manager.
const softLimitRatio = 0.9

// cgroupMemoryFiles hold the container's memory limit: cgroup v2, then v1.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// memorySettings applies the collector defaults above unless GOGC or
// GOMEMLIMIT are set. It returns the GOGC it set (0: the environment's) and
// the soft limit it set in bytes (0: none, or the environment's).
func memorySettings(getenv func(string) string, readFile func(string) ([]byte, error)) (gcPercent int, softLimit int64, err error) {
	if getenv("GOGC") == "" {
		gcPercent = defaultGCPercent
		debug.SetGCPercent(gcPercent)
	}
	if getenv("GOMEMLIMIT") != "" {
		return gcPercent, 0, nil
	}
	limit, err := containerMemoryLimit(readFile)
	if err != nil || limit <= 0 {
		return gcPercent, 0, err
	}
	softLimit = int64(float64(limit) * softLimitRatio)
	debug.SetMemoryLimit(softLimit)
	return gcPercent, softLimit, nil
}

// containerMemoryLimit reads the cgroup's memory limit in bytes; 0 when
// there is none (no cgroup file, "max", or v1's page-rounded maximum).
func containerMemoryLimit(readFile func(string) ([]byte, error)) (int64, error) {
	for _, path := range cgroupMemoryFiles {
		raw, err := readFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("while reading the container memory limit from %s: %w", path, err)
		}
		return parseCgroupLimit(string(raw))
	}
	return 0, nil
}

// parseCgroupLimit parses memory.max ("max" or bytes) or v1's
// memory.limit_in_bytes (a number near MaxInt64 when unlimited).
func parseCgroupLimit(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("while parsing the container memory limit %q: %w", s, err)
	}
	if n <= 0 || n >= math.MaxInt64/2 {
		return 0, nil
	}
	return n, nil
}
