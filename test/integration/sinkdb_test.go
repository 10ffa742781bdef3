package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// sinkDB is the sink database of a crash test run by the real binary. The
// crash tests (the failpoint between COMMIT and ack, the pipeline's chaos,
// the outage longer than the window) take one and run unchanged on each
// dialect: *database (PostgreSQL) and *mariaDB (MariaDB, sink.kind mysql).
// Each implementation creates its database and the effect tables with its
// own DDL and reads the verdict (effects per id, claims, stale rows) with
// its own SQL.
type sinkDB interface {
	// dialect labels the run: "postgres" or "mariadb".
	dialect() string
	// setDSNEnv puts the runtime's DSN in a variable of the test's
	// environment and returns its name (sink.dsnEnv).
	setDSNEnv(t *testing.T) string
	// point sets cfg's sink kind, and its schema to where the tables are
	// (on MariaDB the database).
	point(cfg *config.Config)
	// table is the qualified name of a table in that schema, for the few
	// statements both dialects spell alike (count(*) … WHERE col IS NULL).
	table(name string) string
	// exec runs statements of the dialect; queryInt reads one integer
	// (placeholders of the dialect).
	exec(t *testing.T, stmts ...string)
	queryInt(t *testing.T, sql string, args ...any) int
	// createEffects creates the append effect's table (effects: seq,
	// message_id, n; no unique key, so an id applied twice is a second
	// row); createPipeline the two stages' tables (orders, projected).
	createEffects(t *testing.T)
	createPipeline(t *testing.T)
	// seam opens the sink database through the runtime's seam on the
	// test's own connections (migrations, prune records).
	seam(t *testing.T) sink.DB
	// runtimeSessions counts the sessions of runtime processes (not the
	// test's) on the database.
	runtimeSessions(t *testing.T) int
	// effects reads an append table: rows, distinct ids in idCol, and ids
	// with more than one row.
	effects(t *testing.T, table, idCol string) (rows, ids, doubled int)
	// offPayload counts the effects rows of plainEvents whose n is not the
	// one their message carried (evt-000042 has n 42): the effect written
	// from another message's (or an older) state.
	offPayload(t *testing.T) int
	// versions reads table's keyCol → seqCol (the upsert's rows).
	versions(t *testing.T, table, keyCol, seqCol string) map[string]int
	// claims reads an inbox table: rows and distinct message ids, the
	// claims only (MySQL's epoch marker row is not one).
	claims(t *testing.T, inboxTable string) (rows, distinct int)
	claimedIDs(t *testing.T, inboxTable string) []string
	// countClaimed counts which of ids an inbox table holds.
	countClaimed(t *testing.T, inboxTable string, ids []string) int
	// claimedBefore counts the claims processed before cutoff.
	claimedBefore(t *testing.T, inboxTable string, cutoff time.Time) int
	// staleProgress counts progress records (not stopped) whose last
	// heartbeat, by the database's clock, is older than after.
	staleProgress(t *testing.T, progressTable string, after time.Duration) int
}

// onEachSink runs a crash test once per dialect, as subtests named by it.
// The databases are created in the parent, before any subtest runs, so a
// run may call t.Setenv.
func onEachSink(t *testing.T, run func(t *testing.T, db sinkDB)) {
	for _, newDB := range sinkDBs {
		db := newDB(t)
		t.Run(db.dialect(), func(t *testing.T) { run(t, db) })
	}
}

// sinkDBs create an empty database of each dialect, private to the test.
var sinkDBs = []func(*testing.T) sinkDB{
	func(t *testing.T) sinkDB { return newDatabase(t) },
	func(t *testing.T) sinkDB { return newMariaDB(t) },
}

// dsnEnvFor puts db's DSN in the environment and names the variable.
func dsnEnvFor(t *testing.T, db sinkDB) string {
	t.Helper()
	return db.setDSNEnv(t)
}

// crashVerdict is what a crash test proved from the database alone, in
// the same line on each dialect.
type crashVerdict struct {
	test                       string
	kills, failpointKills      int
	published, unique, applied int
	doubled, lost, stale       int
	extra                      int // ids applied that were never published (not in the line, still a failure)
}

func (v crashVerdict) line(db sinkDB) string {
	return fmt.Sprintf("CRASH test=%s db=%s kills=%d failpointKills=%d published=%d unique=%d applied=%d doubled=%d lost=%d stale=%d",
		v.test, db.dialect(), v.kills, v.failpointKills, v.published, v.unique, v.applied, v.doubled, v.lost, v.stale)
}

// judge prints the line (so that a targeted run shows it without -v), logs
// it, and fails on any doubled, lost, stale or extra id.
func (v crashVerdict) judge(t *testing.T, db sinkDB) {
	t.Helper()
	line := v.line(db)
	fmt.Println(line)
	t.Log(line)
	if v.doubled != 0 || v.lost != 0 || v.stale != 0 || v.extra != 0 {
		t.Errorf("%s on %s: doubled=%d lost=%d stale=%d extra=%d, want 0 each", v.test, db.dialect(), v.doubled, v.lost, v.stale, v.extra)
	}
}

// appendVerdict reads the effects table the append config writes for
// plainEvents(unique): an id is applied when it has a row, doubled with
// more than one, lost with none; a row is stale when its n is not its
// message's.
func appendVerdict(t *testing.T, db sinkDB, test string, kills, failpointKills, published, unique int) crashVerdict {
	t.Helper()
	_, ids, doubled := db.effects(t, "effects", "message_id")
	return crashVerdict{test: test, kills: kills, failpointKills: failpointKills, published: published, unique: unique,
		applied: ids, doubled: doubled, lost: max(unique-ids, 0), stale: db.offPayload(t), extra: max(ids-unique, 0)}
}

// TestCrashVerdictCounts writes an effects table with an id applied twice,
// one never applied and one row carrying another message's state, on each
// sink database, and requires the verdict to count each: the CRASH line's
// zeros mean something on both dialects.
func TestCrashVerdictCounts(t *testing.T) {
	onEachSink(t, func(t *testing.T, db sinkDB) {
		db.createEffects(t)
		// evt-000000 twice, evt-000001 with evt-000003's n, evt-000002
		// never (of 3 published).
		db.exec(t, "INSERT INTO "+db.table("effects")+" (message_id, n) VALUES ('evt-000000', 0), ('evt-000000', 0), ('evt-000001', 3)")
		v := appendVerdict(t, db, "verdict", 0, 0, 3, 3)
		want := crashVerdict{test: "verdict", published: 3, unique: 3, applied: 2, doubled: 1, lost: 1, stale: 1}
		t.Log(v.line(db))
		if v != want {
			t.Errorf("%s: verdict %+v, want %+v", db.dialect(), v, want)
		}
	})
}
