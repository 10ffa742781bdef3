package benchcontroller

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// cpuShares is the CPU time, in seconds, of each process the benchmark
// drives: its own kube-apiserver and etcd (envtest's children), every
// PostgreSQL process (the postmaster's reaped backends included), NATS, the
// manager and the benchmark itself. Read before and after the run, the
// difference says where the machine's two cores went, which is what a
// shorter seconds_to_ready has to take from.
func cpuShares(managerPID int) map[string]float64 {
	self := os.Getpid()
	out := map[string]float64{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(pid)
		if err != nil {
			continue
		}
		var name string
		switch {
		case pid == self:
			name = "benchmark"
		case pid == managerPID:
			name = "manager"
		case st.ppid == self && (st.comm == "kube-apiserver" || st.comm == "etcd"):
			name = st.comm
		case st.comm == "postgres":
			name = "postgres"
			if parent, err := readStat(st.ppid); err == nil && parent.comm != "postgres" {
				st.cpu += st.childCPU // the postmaster: its backends that exited
			}
		case st.comm == "nats-server":
			name = "nats-server"
		default:
			continue
		}
		out[name] += st.cpu
	}
	return out
}

type procStat struct {
	comm          string
	ppid          int
	cpu, childCPU float64
}

func readStat(pid int) (procStat, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	s := string(raw)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return procStat{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[closing+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("short /proc/%d/stat", pid)
	}
	num := func(i int) float64 { v, _ := strconv.ParseFloat(f[i], 64); return v }
	ppid, _ := strconv.Atoi(f[1])
	return procStat{
		comm:     s[open+1 : closing],
		ppid:     ppid,
		cpu:      (num(11) + num(12)) / clockTicks,
		childCPU: (num(13) + num(14)) / clockTicks,
	}, nil
}

// cpuDelta formats after-before per process, largest first.
func cpuDelta(before, after map[string]float64) string {
	type row struct {
		name string
		s    float64
	}
	var rows []row
	total := 0.0
	for name, v := range after {
		d := v - before[name]
		rows = append(rows, row{name, d})
		total += d
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].s > rows[j].s })
	var b strings.Builder
	fmt.Fprintf(&b, " total %.1fs:", total)
	for _, r := range rows {
		fmt.Fprintf(&b, " %s %.1fs (%.0f%%)", r.name, r.s, 100*r.s/total)
	}
	return b.String()
}
