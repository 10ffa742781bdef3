package mysql

// The Partitioned layout on MySQL/MariaDB.
//
// The inbox table is PARTITION BY RANGE COLUMNS (published_on), the UTC day
// of the broker's publish time (inbox.Day), with one partition per day,
// p<YYYYMMDD> holding the days below <YYYYMMDD>+1, and a catch-all pmax
// (VALUES LESS THAN MAXVALUE) above the newest day. Range partitions cover
// everything below their bound, so the oldest day partition also holds any
// older publish day, and a day inside the covered range whose partition was
// never made (or was pruned) lands in the next partition up: a claim never
// fails for want of a partition. New days are split off pmax (REORGANIZE
// PARTITION pmax INTO (p…, pmax)), which copies only pmax's rows: the
// days not made yet, which EnsurePartitionsFor makes before their claims,
// and the epoch marker row (published on 9999-12-31, so never in a day
// partition and never dropped).
//
// The key. MySQL requires the partitioning column in every unique key, so
// the primary key is (message_id, published_on): on its own it refuses an
// id only within one publish day. PostgreSQL's Partitioned layout has the
// same constraint and claims across partitions (runtime/inbox claim.go
// claimPartitioned): a transaction advisory lock per id, then an insert
// that skips ids present in any partition. MySQL has no transaction-scoped
// advisory lock (GET_LOCK is the session's), so the claim takes the same
// lock as a row lock: it upserts the ids' slots (CRC32 of the id modulo
// claimSlots) into <inbox>_claim_locks, sorted (so two claims cannot
// deadlock), which holds an exclusive record lock on each slot until
// commit or rollback; then it reads which ids exist in any partition (a
// READ COMMITTED statement that starts after the locks are held sees every
// claim the locks' previous holders committed) and inserts the rest. So an
// id is claimed once across every live partition, as on PostgreSQL, and an
// id whose day was pruned is, by design, outside retention. Two claims of
// different ids whose slots collide wait for each other's commit, no
// longer; the slot table holds at most claimSlots rows of 4 bytes.
//
// Prune (PrunePartitions) drops whole days below the cutoff with ALTER
// TABLE … DROP PARTITION, under LOCK TABLES … WRITE so that no claim can
// add an id processed after the cutoff to a partition between the check
// that it holds none (a backlog of old messages processed just now) and
// the drop: the runtime user needs the LOCK TABLES privilege for it. All
// partition DDL runs under the inbox's GET_LOCK (the migration lock), with
// a 5-second lock_wait_timeout so a DDL that would queue every claim behind
// a long transaction gives up instead and is retried by the next run.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/crc32"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// claimSlots bounds the claim-lock table (and the false sharing between
// claims of different ids).
const claimSlots = 1 << 16

// maxPartition is the catch-all partition.
const maxPartition = "pmax"

// markerDay is the epoch marker's published_on: always in pmax.
const markerDay = "9999-12-31"

// aheadDays: EnsurePartitionsFor makes no day further than this past the
// local clock's today (a producer's clock years ahead would otherwise make
// one partition cover every day until then, which prune could not drop
// before); such rows wait in pmax until their day is near.
const aheadDays = 7

// partitionDDLTimeout is lock_wait_timeout for partition DDL (seconds).
const partitionDDLTimeout = 5

var dayPartitionRE = regexp.MustCompile(`^p(\d{8})$`)

func claimLocksName(n inbox.Names) string {
	return inbox.DerivedNameMax(n.Inbox, "_claim_locks", MaxIdentifier)
}

// inboxDDL creates the inbox table in the layout (and the claim locks).
func (s *Inbox) inboxDDL() []string {
	idx := quote(inbox.DerivedNameMax(s.names.Inbox, "_processed_at_idx", MaxIdentifier))
	if s.layout != config.LayoutPartitioned {
		return []string{`CREATE TABLE IF NOT EXISTS ` + s.inbox + ` (
			message_id   VARBINARY(1024) NOT NULL PRIMARY KEY,
			processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
			fingerprint  BIGINT NULL,
			KEY ` + idx + ` (processed_at)
		) ENGINE=InnoDB`}
	}
	return []string{`CREATE TABLE IF NOT EXISTS ` + s.inbox + ` (
			message_id   VARBINARY(1024) NOT NULL,
			published_on DATE NOT NULL,
			processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
			fingerprint  BIGINT NULL,
			PRIMARY KEY (message_id, published_on),
			KEY ` + idx + ` (processed_at)
		) ENGINE=InnoDB PARTITION BY RANGE COLUMNS (published_on) (PARTITION ` + maxPartition + ` VALUES LESS THAN (MAXVALUE))`,
		`CREATE TABLE IF NOT EXISTS ` + s.claimLocks + ` (
			slot INT UNSIGNED NOT NULL PRIMARY KEY
		) ENGINE=InnoDB`,
	}
}

// markerInsert writes the epoch marker row (id, processed_at).
func (s *Inbox) markerInsert() string {
	if s.layout == config.LayoutPartitioned {
		return `INSERT INTO ` + s.inbox + ` (message_id, processed_at, published_on) VALUES (?, ?, '` + markerDay + `')`
	}
	return `INSERT INTO ` + s.inbox + ` (message_id, processed_at) VALUES (?, ?)`
}

// claimPartitioned claims ids (sorted, deduplicated; fps theirs) published
// on the days of their first claim: slot locks, the read of which exist in
// any partition, the insert of the rest (see the file's comment).
func (s *Inbox) claimPartitioned(ctx context.Context, t *sql.Tx, claims []inbox.Claim, ids []string, fps []int64) (map[string]struct{}, error) {
	slots := make([]uint32, 0, len(ids))
	for _, id := range ids {
		slots = append(slots, crc32.ChecksumIEEE([]byte(id))%claimSlots)
	}
	slices.Sort(slots)
	slots = slices.Compact(slots)
	lockArgs := make([]any, len(slots))
	for i, sl := range slots {
		lockArgs[i] = sl
	}
	if _, err := t.ExecContext(ctx, `INSERT INTO `+s.claimLocks+` (slot) VALUES `+placeholders(len(slots), 1)+
		` ON DUPLICATE KEY UPDATE slot = slot`, lockArgs...); err != nil {
		return nil, fmt.Errorf("while locking the claimed ids: %w", err)
	}
	in := make([]any, len(ids))
	for i, id := range ids {
		in[i] = idArg(id)
	}
	rows, err := t.QueryContext(ctx, `SELECT message_id FROM `+s.inbox+` WHERE message_id IN (`+
		strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ")+`)`, in...)
	if err != nil {
		return nil, fmt.Errorf("while claiming %d ids in the inbox: %w", len(ids), err)
	}
	existing := make(map[string]struct{}, len(ids))
	if err := collect(rows, existing); err != nil {
		return nil, fmt.Errorf("while claiming %d ids in the inbox: %w", len(ids), err)
	}
	day := make(map[string]time.Time, len(ids))
	for _, c := range claims {
		if _, ok := day[c.MessageID]; !ok {
			day[c.MessageID] = inbox.Day(c.PublishedAt)
		}
	}
	fresh := make(map[string]struct{}, len(ids)-len(existing))
	insert := make([]any, 0, 3*(len(ids)-len(existing)))
	for i, id := range ids {
		if _, ok := existing[id]; ok {
			continue
		}
		fresh[id] = struct{}{}
		var fp any
		if fps[i] != 0 {
			fp = fps[i]
		}
		insert = append(insert, idArg(id), day[id].Format(time.DateOnly), fp)
	}
	if len(fresh) == 0 {
		return fresh, nil
	}
	// The slots are held: no other transaction inserts these ids now, so a
	// plain INSERT (a duplicate would be a bug, and fails loudly).
	if _, err := t.ExecContext(ctx, `INSERT INTO `+s.inbox+` (message_id, published_on, fingerprint) VALUES `+
		placeholders(len(fresh), 3), insert...); err != nil {
		return nil, fmt.Errorf("while claiming %d ids in the inbox: %w", len(fresh), err)
	}
	return fresh, nil
}

// dayCache remembers the days known to be covered by a partition, so the
// claim path issues no statement for a day it has seen.
type dayCache struct {
	mu    sync.Mutex
	known map[time.Time]bool
}

func (c *dayCache) missing(days []time.Time) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Time
	for _, d := range days {
		if !c.known[d] && !slices.ContainsFunc(out, d.Equal) {
			out = append(out, d)
		}
	}
	return out
}

func (c *dayCache) add(days []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range days {
		c.known[d] = true
	}
}

func (c *dayCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.known = map[time.Time]bool{}
}

// EnsurePartitions makes the day partitions [from, from+days); a no-op in
// the Table layout.
func (s *Inbox) EnsurePartitions(ctx context.Context, from time.Time, days int) (err error) {
	defer s.advise(&err)
	want := make([]time.Time, 0, days)
	for i := range days {
		want = append(want, inbox.Day(from).AddDate(0, 0, i))
	}
	return s.ensureDays(ctx, want)
}

// EnsurePartitionsFor makes the partitions of these publish times' days
// (skipping days already known, and days more than aheadDays ahead); the
// consumer calls it before the claim transaction.
func (s *Inbox) EnsurePartitionsFor(ctx context.Context, published []time.Time) (err error) {
	defer s.advise(&err)
	limit := inbox.Day(time.Now()).AddDate(0, 0, aheadDays)
	days := make([]time.Time, 0, 1)
	for _, p := range published {
		if d := inbox.Day(p); !d.After(limit) {
			days = append(days, d)
		}
	}
	return s.ensureDays(ctx, days)
}

// ForgetPartitions drops the cache of known days.
func (s *Inbox) ForgetPartitions() { s.days.reset() }

// ensureDays splits the missing days above the newest day partition off
// pmax, in one statement under the DDL lock; days at or below it are
// covered already. Idempotent: the partitions are read again under the
// lock, and one ALTER either happens whole or not (MariaDB 10.6+'s atomic
// DDL), so a crash leaves either layout, which the next pass reads.
func (s *Inbox) ensureDays(ctx context.Context, days []time.Time) error {
	if s.layout != config.LayoutPartitioned {
		return nil
	}
	missing := s.days.missing(days)
	if len(missing) == 0 {
		return nil
	}
	err := s.withLock(ctx, func(conn *sql.Conn) error {
		parts, err := s.listPartitions(ctx, conn)
		if err != nil {
			return err
		}
		var newest time.Time
		if len(parts) > 0 {
			newest = parts[len(parts)-1].day
		}
		var add []time.Time
		for _, d := range missing {
			if d.After(newest) {
				add = append(add, d)
			}
		}
		if len(add) == 0 {
			return nil
		}
		sort.Slice(add, func(i, j int) bool { return add[i].Before(add[j]) })
		var b strings.Builder
		for _, d := range add {
			// Bounds are formatted from a time.Time, never from input.
			fmt.Fprintf(&b, "PARTITION %s VALUES LESS THAN ('%s'), ", partitionName(d), d.AddDate(0, 0, 1).Format(time.DateOnly))
		}
		return s.partitionDDL(ctx, conn, `ALTER TABLE `+s.inbox+` REORGANIZE PARTITION `+maxPartition+` INTO (`+
			b.String()+`PARTITION `+maxPartition+` VALUES LESS THAN (MAXVALUE))`)
	})
	if err != nil {
		return fmt.Errorf("while creating inbox partitions: %w", err)
	}
	s.days.add(missing)
	return nil
}

// partitionDDL runs stmt on conn with a short lock_wait_timeout (the
// connection goes back to the pool with the default again).
func (s *Inbox) partitionDDL(ctx context.Context, conn *sql.Conn, stmt string) error {
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d", partitionDDLTimeout)); err != nil {
		return err
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), "SET SESSION lock_wait_timeout = DEFAULT") }()
	_, err := conn.ExecContext(ctx, stmt)
	return err
}

// isNumber: err is the server's error number n.
func isNumber(err error, n uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == n
}

func partitionName(day time.Time) string { return "p" + day.Format("20060102") }

type dayPartition struct {
	name string
	day  time.Time
}

// listPartitions returns the day partitions, oldest first (pmax and any
// partition not named p<YYYYMMDD> left out: never dropped).
func (s *Inbox) listPartitions(ctx context.Context, q queryer) ([]dayPartition, error) {
	rows, err := q.QueryContext(ctx, `SELECT partition_name FROM information_schema.partitions
		WHERE table_schema = ? AND table_name = ? AND partition_name IS NOT NULL`, s.names.Schema, s.names.Inbox)
	if err != nil {
		return nil, fmt.Errorf("while listing inbox partitions: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []dayPartition
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("while listing inbox partitions: %w", err)
		}
		m := dayPartitionRE.FindStringSubmatch(n)
		if m == nil {
			continue
		}
		if day, err := time.Parse("20060102", m[1]); err == nil {
			out = append(out, dayPartition{name: n, day: day})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("while listing inbox partitions: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].day.Before(out[j].day) })
	return out, nil
}

// errPartitionInUse: a partition below the cutoff still holds an id
// processed after it (published long ago, processed just now): kept until
// it expires.
var errPartitionInUse = errors.New("partition holds ids processed after the cutoff")

// PrunePartitions drops the day partitions whose whole range lies below the
// bound's cutoff, oldest first, and records the run like PruneTable. A
// partition holding an id processed at or after the cutoff is kept.
func (s *Inbox) PrunePartitions(ctx context.Context, b inbox.Bound) (res inbox.PruneResult, err error) {
	defer s.advise(&err)
	if s.layout != config.LayoutPartitioned {
		return res, errors.New("while pruning: a Table inbox is pruned with PruneTable")
	}
	run, res, err := s.startRun(ctx, b)
	if err != nil {
		return res, err
	}
	err = s.withLock(ctx, func(conn *sql.Conn) error {
		parts, err := s.listPartitions(ctx, conn)
		if err != nil {
			return err
		}
		for _, p := range parts {
			if p.day.AddDate(0, 0, 1).After(res.Cutoff) {
				return nil
			}
			switch err := s.dropPartition(ctx, conn, p.name, res.Cutoff); {
			case errors.Is(err, errPartitionInUse):
				continue // kept; the newer days are still checked, as on PostgreSQL
			case err != nil:
				return err
			}
			res.PartitionsDropped++
		}
		return nil
	})
	// A dropped day is covered by the next partition up; forget anyway.
	s.days.reset()
	return res, s.finishRun(ctx, run, res, err)
}

// dropPartition checks and drops one partition with claims locked out
// (LOCK TABLES … WRITE on the inbox, released whatever happens).
func (s *Inbox) dropPartition(ctx context.Context, conn *sql.Conn, name string, cutoff time.Time) (err error) {
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("SET SESSION lock_wait_timeout = %d", partitionDDLTimeout)); err != nil {
		return err
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), "SET SESSION lock_wait_timeout = DEFAULT") }()
	if _, err := conn.ExecContext(ctx, `LOCK TABLES `+s.inbox+` WRITE`); err != nil {
		if isNumber(err, 1044) {
			err = &PrivilegeError{Err: err, Grant: grantOn("LOCK TABLES", s.names.Schema, s.d.account)}
		}
		return fmt.Errorf("while locking the inbox to drop partition %s: %w", name, err)
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), `UNLOCK TABLES`) }()
	var young bool
	if err := conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.inbox+` PARTITION (`+quote(name)+`)
		WHERE processed_at >= ?)`, cutoff.UTC()).Scan(&young); err != nil {
		return fmt.Errorf("while checking partition %s for recent ids: %w", name, err)
	}
	if young {
		return errPartitionInUse
	}
	if _, err := conn.ExecContext(ctx, `ALTER TABLE `+s.inbox+` DROP PARTITION `+quote(name)); err != nil {
		return fmt.Errorf("while dropping partition %s: %w", name, err)
	}
	return nil
}
