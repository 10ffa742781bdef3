package inbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

func TestPruneTableDeletesOnlyOlderThanCutoff(t *testing.T) {
	s, pool := migrated(t, config.LayoutTable)
	ctx := context.Background()
	const window = 48 * time.Hour
	// 3000 rows spread ±2h around the cutoff, at random.
	pgtest.Exec(t, pool, fmt.Sprintf(`INSERT INTO idc.inbox_orders (message_id, processed_at)
		SELECT 'id-' || g, now() - interval '%d seconds' + (random() * 4 - 2) * interval '1 hour'
		FROM generate_series(1, 3000) g`, int(window.Seconds())))
	var olderBefore int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM idc.inbox_orders WHERE processed_at < now() - interval '48 hours'").Scan(&olderBefore); err != nil {
		t.Fatal(err)
	}
	res, err := s.PruneTable(ctx, Bound{Window: window}, 97, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var older, younger int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE processed_at < $1), count(*) FILTER (WHERE processed_at >= $1)
		FROM idc.inbox_orders`, res.Cutoff).Scan(&older, &younger); err != nil {
		t.Fatal(err)
	}
	if older != 0 {
		t.Errorf("%d rows older than the cutoff survived", older)
	}
	if younger+res.RowsDeleted != 3000 {
		t.Errorf("deleted %d + kept %d != 3000: something younger than the cutoff was deleted", res.RowsDeleted, younger)
	}
	// The cutoff is taken a moment after the count above, so it may cover a
	// few more rows, never fewer.
	if res.RowsDeleted < olderBefore || res.RowsDeleted < 1000 {
		t.Errorf("RowsDeleted = %d, want >= %d", res.RowsDeleted, olderBefore)
	}
	if d := time.Since(res.Cutoff) - window; d < -time.Minute || d > time.Minute {
		t.Errorf("cutoff %s is not now()-48h", res.Cutoff)
	}
	run, err := s.LastPruneRun(ctx)
	if err != nil || run == nil {
		t.Fatalf("LastPruneRun = %v, %v", run, err)
	}
	if run.RowsDeleted != res.RowsDeleted || run.FinishedAt == nil || run.Error != "" || run.Window != window || !run.Cutoff.Equal(res.Cutoff) {
		t.Errorf("prune run recorded as %+v, result %+v", run, res)
	}
	// A zero maxDuration deletes nothing but is still recorded.
	if res, err := s.PruneTable(ctx, Bound{Window: time.Hour}, 10, 0); err != nil || res.RowsDeleted != 0 {
		t.Errorf("PruneTable with no time = %+v, %v", res, err)
	}
	if next, _ := s.LastPruneRun(ctx); next == nil || next.ID <= run.ID {
		t.Errorf("second run not recorded: %+v", next)
	}
}

func TestPrunePartitionsDropsWholeOldDays(t *testing.T) {
	s, pool := migrated(t, config.LayoutPartitioned)
	ctx := context.Background()
	today := Day(time.Now())
	if err := s.EnsurePartitions(ctx, today.AddDate(0, 0, -10), 12); err != nil {
		t.Fatal(err)
	}
	for d := -10; d <= 1; d++ {
		claim(t, s, pool, Claim{MessageID: fmt.Sprintf("m%d", d), PublishedAt: today.AddDate(0, 0, d).Add(time.Hour)})
	}
	// Those ids were processed on their publish day...
	pgtest.Exec(t, pool, "UPDATE "+s.QualifiedInbox()+" SET processed_at = published_on + interval '1 hour'")
	// ...except one from a backlog: published 8 days ago, processed just now.
	// It can still be redelivered, so its partition must survive the prune.
	backlog := today.AddDate(0, 0, -8)
	claim(t, s, pool, Claim{MessageID: "backlog", PublishedAt: backlog.Add(2 * time.Hour)})
	if _, err := s.PruneTable(ctx, Bound{Window: time.Hour}, 10, time.Minute); err == nil {
		t.Error("PruneTable must refuse a Partitioned inbox")
	}
	const window = 4 * 24 * time.Hour
	res, err := s.PrunePartitions(ctx, Bound{Window: window})
	if err != nil {
		t.Fatal(err)
	}
	parts, err := s.listPartitions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parts {
		if !p.day.AddDate(0, 0, 1).After(res.Cutoff) && !p.day.Equal(backlog) {
			t.Errorf("partition %s is entirely older than cutoff %s but was kept", p.name, res.Cutoff)
		}
	}
	// Days -10..-5 end before now-4d; day -8 holds the backlog id; day -4
	// ends after the cutoff unless the test runs exactly at midnight.
	if res.PartitionsDropped != 5 || !parts[0].day.Equal(backlog) || !parts[1].day.Equal(today.AddDate(0, 0, -4)) {
		t.Errorf("dropped %d partitions, oldest left %v, %v; want 5 dropped, oldest %v then %v",
			res.PartitionsDropped, parts[0].day, parts[1].day, backlog, today.AddDate(0, 0, -4))
	}
	assertSet(t, claim(t, s, pool, Claim{MessageID: "backlog", PublishedAt: backlog.Add(2 * time.Hour)}))
	run, err := s.LastPruneRun(ctx)
	if err != nil || run == nil || run.PartitionsDropped != 5 || run.Error != "" {
		t.Fatalf("LastPruneRun = %+v, %v", run, err)
	}
	// A message of a pruned day re-creates its partition on demand.
	old := today.AddDate(0, 0, -9)
	if err := s.EnsurePartitionsFor(ctx, []time.Time{old}); err != nil {
		t.Fatal(err)
	}
	assertSet(t, claim(t, s, pool, Claim{MessageID: "late", PublishedAt: old}), "late")
}
