package main

import (
	"errors"
	"io/fs"
	"math"

	"runtime/debug"
	"strconv"
	"strings"
)

// runGCPercent is the consumer's GOGC when the environment sets none. Its
// live heap is small (a few MiB: the batches in flight) and it allocates in
// proportion to the messages, so with the collector's default of 100 it ran
// a collection every few MiB, and garbage collection was the largest single
// cost per message (about a quarter of the replica's CPU at batch 500).
// 400 lets the heap grow to five times the live data between collections:
// a few tens of MiB, within the runtime container's 128Mi request.
const runGCPercent = 400

// runSoftLimitRatio is the share of a container memory limit the Go
// runtime is asked to stay under (GOMEMLIMIT) when one is set: near it the
// collector runs more often instead of the kernel killing the replica, so
// the higher GOGC never costs an OOM kill.
const runSoftLimitRatio = 0.9

// cgroupMemoryMax holds the container's memory limit (cgroup v2, then v1).
var cgroupMemoryMax = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// consumerMemorySettings applies runGCPercent unless GOGC is set, and a soft
// limit under the container's memory limit unless GOMEMLIMIT is set. It
// returns what it set (0: left to the environment, or no limit).
func consumerMemorySettings(getenv func(string) string, readFile func(string) ([]byte, error)) (gcPercent int, softLimit int64) {
	if getenv("GOGC") == "" {
		gcPercent = runGCPercent
		debug.SetGCPercent(gcPercent)
	}
	if getenv("GOMEMLIMIT") != "" {
		return gcPercent, 0
	}
	for _, path := range cgroupMemoryMax {
		raw, err := readFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return gcPercent, 0
		}
		s := strings.TrimSpace(string(raw))
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= math.MaxInt64/2 { // "max", or v1's unlimited
			return gcPercent, 0
		}
		softLimit = int64(float64(n) * runSoftLimitRatio)
		debug.SetMemoryLimit(softLimit)
		return gcPercent, softLimit
	}
	return gcPercent, 0
}
