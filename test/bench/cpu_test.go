package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on
// Linux/amd64).
const clockTicks = 100

// cpuSnapshot is the CPU time (user + system) spent so far by the row's
// NATS server, the machine's PostgreSQL server (live processes plus the
// children the postmaster reaped: backends of closed connections) and this
// benchmark process.
type cpuSnapshot struct {
	at                            time.Time
	nats, postgres, runtime, self time.Duration
	// rabbit and redis are RabbitMQ's (beam.smp) and Redis's CPU.
	rabbit, redis time.Duration
	// mariadb is MariaDB's server (mariadbd, all its threads).
	mariadb time.Duration
	// natsPID is the NATS server counted as nats (0: every nats-server
	// process).
	natsPID int
}

// takeCPU reads the snapshot; natsPID is the row's NATS server (0: every
// nats-server process, as when the machine had only one), replicas are the
// pids of idc-runtime processes, counted as runtime.
func takeCPU(natsPID int, replicas ...int) cpuSnapshot {
	s := cpuSnapshot{at: time.Now(), natsPID: natsPID, self: selfCPU()}
	for _, pid := range replicas {
		if _, fields, ok := readStat(fmt.Sprintf("/proc/%d/stat", pid)); ok {
			s.runtime += ticks(fields, 11) + ticks(fields, 12)
		}
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		comm, fields, ok := readStat(p)
		if !ok {
			continue
		}
		switch comm {
		case "nats-server":
			if natsPID != 0 && p != fmt.Sprintf("/proc/%d/stat", natsPID) {
				continue // the run's other server, or another suite's
			}
			s.nats += ticks(fields, 11) + ticks(fields, 12) + ticks(fields, 13) + ticks(fields, 14)
		case "postgres":
			s.postgres += ticks(fields, 11) + ticks(fields, 12) + ticks(fields, 13) + ticks(fields, 14)
		case "beam.smp":
			s.rabbit += ticks(fields, 11) + ticks(fields, 12)
		case "redis-server":
			s.redis += ticks(fields, 11) + ticks(fields, 12)
		case "mariadbd":
			s.mariadb += ticks(fields, 11) + ticks(fields, 12)
		}
	}
	return s
}

// readStat splits /proc/<pid>/stat after the command name: fields[0] is
// the state (field 3), fields[11..14] utime, stime, cutime, cstime.
func readStat(path string) (string, []string, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", nil, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", nil, false
	}
	fields := strings.Fields(s[end+1:])
	if len(fields) < 15 {
		return "", nil, false
	}
	return s[open+1 : end], fields, true
}

func ticks(fields []string, i int) time.Duration {
	n, _ := strconv.ParseInt(fields[i], 10, 64)
	return time.Duration(n) * time.Second / clockTicks
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuUse is where the cores went during one row.
type cpuUse struct {
	wall                          time.Duration
	nats, postgres, runtime, self time.Duration
	rabbit, redis                 time.Duration
	// commits and commitSeconds are the replicas' transactions and
	// their time in COMMIT over the whole row, first round included
	// (idc_commit_duration_seconds); 0 in-process.
	commits       int
	commitSeconds float64
	// mariadb is MariaDB's CPU; sink, when mysql, makes it the row's
	// database in the line (in place of postgres).
	mariadb time.Duration
	sink    config.SinkKind
}

func cpuSince(before cpuSnapshot, replicas ...int) *cpuUse {
	after := takeCPU(before.natsPID, replicas...)
	return &cpuUse{wall: after.at.Sub(before.at), nats: after.nats - before.nats, postgres: after.postgres - before.postgres,
		runtime: after.runtime - before.runtime, self: after.self - before.self,
		rabbit: after.rabbit - before.rabbit, redis: after.redis - before.redis, mariadb: after.mariadb - before.mariadb}
}

// database is the row's database server and its CPU: PostgreSQL's, or
// MariaDB's on the MariaDB rows.
func (c cpuUse) database() (string, time.Duration) {
	if c.sink == config.SinkMySQL {
		return "mariadb", c.mariadb
	}
	return "postgres", c.postgres
}

func (c cpuUse) String() string {
	dbName, db := c.database()
	total := c.nats + db + c.runtime + c.self
	s := fmt.Sprintf("wall=%.2fs nats=%.2fs %s=%.2fs idc_runtime=%.2fs bench_process=%.2fs total=%.2fs cores_busy=%.2f of %d",
		c.wall.Seconds(), c.nats.Seconds(), dbName, db.Seconds(), c.runtime.Seconds(), c.self.Seconds(), total.Seconds(),
		total.Seconds()/c.wall.Seconds(), runtime.NumCPU())
	if c.rabbit > 0 || c.redis > 0 {
		s += fmt.Sprintf(" (besides: rabbitmq=%.2fs redis=%.2fs)", c.rabbit.Seconds(), c.redis.Seconds())
	}
	if c.commits > 0 {
		s += fmt.Sprintf(" commits=%d mean_commit_ms=%.2f", c.commits, 1000*c.commitSeconds/float64(c.commits))
	}
	return s
}

func (rs *replicaSet) pids() []int {
	pids := make([]int, len(rs.cmds))
	for i, c := range rs.cmds {
		pids[i] = c.Process.Pid
	}
	return pids
}

// perMessage is each component's CPU per message of the row, in µs.
func (c cpuUse) perMessage(msgs int) string {
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(msgs) }
	dbName, db := c.database()
	return fmt.Sprintf("us_per_msg: nats=%.2f %s=%.2f idc_runtime=%.2f bench_process=%.2f total=%.2f",
		us(c.nats), dbName, us(db), us(c.runtime), us(c.self), us(c.nats+db+c.runtime+c.self))
}
