package inbox

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// partitionSuffixRE matches the day suffix of partition names.
var partitionSuffixRE = regexp.MustCompile(`_p(\d{8})$`)

// partitionCache remembers days known to have a partition, so the claim path
// issues DDL only for a day it has not seen.
type partitionCache struct {
	mu    sync.Mutex
	known map[time.Time]bool
}

func (c *partitionCache) missing(days []time.Time) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Time
	for _, d := range days {
		if !c.known[d] {
			out = append(out, d)
		}
	}
	return out
}

func (c *partitionCache) add(days []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range days {
		c.known[d] = true
	}
}

func (c *partitionCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.known = map[time.Time]bool{}
}

// Day is the UTC calendar day of t: the partition key of a publish time. A
// zero publish time (a broker that reports none) maps to today.
func Day(t time.Time) time.Time {
	if t.IsZero() {
		t = time.Now()
	}
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// PartitionName is the table name of the partition holding day.
func (s *Store) PartitionName(day time.Time) string {
	return DerivedName(s.names.Inbox, "_p"+day.Format("20060102"))
}

// EnsurePartitions creates the day partitions [from, from+days) that do not
// exist yet. A no-op for the Table layout.
func (s *Store) EnsurePartitions(ctx context.Context, from time.Time, days int) error {
	want := make([]time.Time, 0, days)
	for i := 0; i < days; i++ {
		want = append(want, Day(from).AddDate(0, 0, i))
	}
	return s.ensureDays(ctx, want)
}

// EnsurePartitionsFor creates the partitions the given publish times fall
// into, skipping days already known. The consumer calls it before the claim
// transaction: DDL inside it would lock the parent against other replicas.
func (s *Store) EnsurePartitionsFor(ctx context.Context, published []time.Time) error {
	seen := map[time.Time]bool{}
	var days []time.Time
	for _, p := range published {
		d := Day(p)
		if !seen[d] {
			seen[d] = true
			days = append(days, d)
		}
	}
	return s.ensureDays(ctx, days)
}

// ForgetPartitions drops the cache of known partitions, e.g. after a claim
// failed because a partition was pruned meanwhile.
func (s *Store) ForgetPartitions() { s.partitions.reset() }

func (s *Store) ensureDays(ctx context.Context, days []time.Time) error {
	if s.layout != config.LayoutPartitioned {
		return nil
	}
	missing := s.partitions.missing(days)
	if len(missing) == 0 {
		return nil
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		names := make([]string, len(missing))
		for i, d := range missing {
			names[i] = qualify(s.names.Schema, s.PartitionName(d))
		}
		// Only partitions that do not exist yet are created and given the
		// truncation trigger (when the inbox has one): a trigger created
		// on a live partition would lock out its claims.
		var absent []string
		var triggered bool
		if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(n), '{}'), to_regprocedure($2) IS NOT NULL
			FROM unnest($1::text[]) n WHERE to_regclass(n) IS NULL`, names,
			qualify(s.names.Schema, DerivedName(s.names.Inbox, "_truncated"))+"()").Scan(&absent, &triggered); err != nil {
			return fmt.Errorf("while looking for inbox partitions: %w", err)
		}
		stmts := make([]string, 0, 2*len(missing))
		for i, d := range missing {
			if !slices.Contains(absent, names[i]) {
				continue
			}
			// Literal bounds are formatted from a time.Time, never from input.
			stmts = append(stmts, fmt.Sprintf(
				"CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')",
				names[i], s.inbox, d.Format(time.DateOnly), d.AddDate(0, 0, 1).Format(time.DateOnly)))
			if triggered {
				stmts = append(stmts, s.truncationTrigger(names[i]))
			}
		}
		return execAll(ctx, tx, stmts)
	})
	if err != nil {
		return fmt.Errorf("while creating inbox partitions: %w", err)
	}
	s.partitions.add(missing)
	return nil
}

// partition is one day partition found in the catalog.
type partition struct {
	name string
	day  time.Time
}

// listPartitions returns the day partitions of the inbox, oldest first.
func (s *Store) listPartitions(ctx context.Context) ([]partition, error) {
	return s.listPartitionsIn(ctx, s.pool)
}

// listPartitionsIn is listPartitions through q (a transaction).
func (s *Store) listPartitionsIn(ctx context.Context, q Querier) ([]partition, error) {
	rows, err := q.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = $1::regclass`, s.inbox)
	if err != nil {
		return nil, fmt.Errorf("while listing inbox partitions: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("while listing inbox partitions: %w", err)
	}
	var out []partition
	for _, n := range names {
		m := partitionSuffixRE.FindStringSubmatch(n)
		if m == nil {
			continue // not ours (an operator attached it by hand): never dropped
		}
		day, err := time.Parse("20060102", m[1])
		if err != nil {
			continue
		}
		out = append(out, partition{name: n, day: day})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].day.Before(out[j].day) })
	return out, nil
}
