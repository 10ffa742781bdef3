package bench

import (
	"context"
	"fmt"
	"os"
	"time"
)

func printLocks(r row) {
	if l := r.locks; l.samples > 0 {
		holders := ""
		if l.holders {
			holders = fmt.Sprintf(" holders: committing=%d idle_in_tx=%d chained=%d running=%d other=%d",
				l.committing, l.idle, l.chained, l.running, l.other)
		}
		fmt.Printf("LOCKS row=%s replicas=%d batch=%d lock_transactionid_waits=%d (claim %d, effect %d) samples=%d every=%s%s\n",
			r.name, r.replicas, r.batch, l.waits, l.claim, l.waits-l.claim, l.samples, lockSampleEvery, holders)
	}
}

// lockSampleEvery is how often sampleLockWaits reads pg_stat_activity.
const lockSampleEvery = 10 * time.Millisecond

// lockStats is what sampleLockWaits saw over a row.
type lockStats struct {
	// waits is how many backends it found waiting on another
	// transaction's row lock over samples samples; claim of them in the
	// inbox claim (an id another transaction claimed and has not committed
	// yet), the rest in the effect (a key another transaction upserted).
	waits, claim, samples int
	// What the transactions they waited for were doing (each counted once
	// per sample): in COMMIT (its WAL flush), idle in transaction (between
	// two statements: the client's round trip), waiting on a lock
	// themselves (a chain), or running a statement.
	// Only with IDC_BENCH_LOCK_HOLDERS=1: pg_blocking_pids takes the lock
	// manager's partition locks, so sampling it every 10 ms slows the
	// rows it measures. other is a blocker that had finished (or was
	// between transactions) by the time pg_stat_activity was read.
	committing, idle, chained, running, other int
	holders                                   bool
}

// sampleLockWaits samples pg_stat_activity every lockSampleEvery until the
// returned func is called: the backends waiting on another transaction's
// row lock (wait_event Lock:transactionid: replicas upserting the same
// keys) and what their blockers were doing.
// On MariaDB it samples nothing (no LOCKS line).
func (t *throughputEnv) sampleLockWaits() func() lockStats {
	if _, pg := t.sink.(pgSink); !pg {
		return func() lockStats { return lockStats{} }
	}
	stop := make(chan struct{})
	st := lockStats{holders: os.Getenv("IDC_BENCH_LOCK_HOLDERS") == "1"}
	done := tickUntil(stop, lockSampleEvery, func() {
		if one, err := t.lockSample(st.holders); err == nil {
			st.add(one)
		}
	})
	return func() lockStats {
		close(stop)
		<-done
		return st
	}
}

// lockSample is one look at pg_stat_activity: the waiters, and with
// holders what their blockers were doing.
func (t *throughputEnv) lockSample(holders bool) (lockStats, error) {
	var one lockStats
	if !holders {
		err := t.pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE query LIKE 'INSERT INTO %inbox%')
			FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'transactionid'`).Scan(&one.waits, &one.claim)
		return one, err
	}
	err := t.pool.QueryRow(context.Background(), `WITH w AS (
			SELECT pid, query FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'transactionid'),
		h AS (SELECT DISTINCT unnest(pg_blocking_pids(w.pid)) AS pid FROM w)
		SELECT (SELECT count(*) FROM w), (SELECT count(*) FROM w WHERE query LIKE 'INSERT INTO %inbox%'),
			count(*) FILTER (WHERE b.state = 'active' AND b.query ILIKE 'commit%'),
			count(*) FILTER (WHERE b.state LIKE 'idle in transaction%'),
			count(*) FILTER (WHERE b.state = 'active' AND NOT b.query ILIKE 'commit%' AND b.wait_event_type = 'Lock'),
			count(*) FILTER (WHERE b.state = 'active' AND NOT b.query ILIKE 'commit%' AND b.wait_event_type IS DISTINCT FROM 'Lock'),
			count(*) FILTER (WHERE b.state IS DISTINCT FROM 'active' AND b.state NOT LIKE 'idle in transaction%')
		FROM h JOIN pg_stat_activity b ON b.pid = h.pid`).Scan(&one.waits, &one.claim, &one.committing, &one.idle, &one.chained, &one.running, &one.other)
	return one, err
}

// add counts one sample.
func (st *lockStats) add(one lockStats) {
	st.waits += one.waits
	st.claim += one.claim
	st.committing += one.committing
	st.idle += one.idle
	st.chained += one.chained
	st.running += one.running
	st.other += one.other
	st.samples++
}
