package process

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// SoftLimitRatio is the share of the container's memory limit the Go
// runtime is asked to stay under (GOMEMLIMIT), leaving room for what it does
// not count (the binary's mapped pages, C stacks): near the limit the
// collector works harder instead of the kernel killing the process, so a
// binary's higher GOGC never costs an OOM kill.
const SoftLimitRatio = 0.9

// cgroupMemoryFiles hold the container's memory limit: cgroup v2, then v1.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// Memory is what SetMemory set.
type Memory struct {
	// GCPercent is the GOGC set; 0 when the environment's GOGC is left in
	// force.
	GCPercent int
	// SoftLimit is the soft memory limit set, in bytes; 0 when none was set
	// (the environment's GOMEMLIMIT, or no container limit).
	SoftLimit int64
}

// SetMemory applies gcPercent unless GOGC is set, and a soft memory limit
// under the container's limit unless GOMEMLIMIT is set. An error (a cgroup
// file that cannot be read or parsed) leaves the soft limit unset and is the
// caller's to log: it is never a reason to stop (see the package comment).
func SetMemory(gcPercent int) (Memory, error) {
	return setMemory(gcPercent, os.Getenv, cgroupMemoryFiles)
}

func setMemory(gcPercent int, getenv func(string) string, cgroupFiles []string) (Memory, error) {
	var m Memory
	if getenv("GOGC") == "" {
		m.GCPercent = gcPercent
		debug.SetGCPercent(gcPercent)
	}
	if getenv("GOMEMLIMIT") != "" {
		return m, nil
	}
	limit, err := containerMemoryLimit(cgroupFiles)
	if err != nil || limit <= 0 {
		return m, err
	}
	m.SoftLimit = int64(float64(limit) * SoftLimitRatio)
	debug.SetMemoryLimit(m.SoftLimit)
	return m, nil
}

// containerMemoryLimit reads the cgroup's memory limit in bytes from the
// first of files that exists; 0 when there is none.
func containerMemoryLimit(files []string) (int64, error) {
	for _, path := range files {
		raw, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("while reading the container memory limit from %s: %w", path, err)
		}
		n, err := parseCgroupLimit(string(raw))
		if err != nil {
			return 0, fmt.Errorf("while reading the container memory limit from %s: %w", path, err)
		}
		return n, nil
	}
	return 0, nil
}

// parseCgroupLimit parses memory.max ("max" or bytes) or v1's
// memory.limit_in_bytes (a number near MaxInt64 when unlimited); 0 is no
// limit.
func parseCgroupLimit(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is neither \"max\" nor a number of bytes", s)
	}
	if n <= 0 || n >= math.MaxInt64/2 {
		return 0, nil
	}
	return n, nil
}
