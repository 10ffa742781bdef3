package mysql_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"

	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

func open(t *testing.T) (*mysql.DB, string) {
	t.Helper()
	name, dsn := mysqltest.NewDatabase(t)
	d, err := mysql.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(d.Close)
	return d, name
}

func exec(t *testing.T, d *mysql.DB, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		if _, err := d.SQL().ExecContext(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func newInbox(t *testing.T, d *mysql.DB, db string, opts ...inbox.Option) sink.Inbox {
	t.Helper()
	in, err := d.Inbox(config.Sink{Schema: db, InboxTable: "inbox_orders", Layout: config.LayoutTable}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// Every connection runs at READ COMMITTED, strict and in UTC, and
// MariaDB 10.11 gets the RETURNING claim.
func TestSessionSettings(t *testing.T) {
	d, _ := open(t)
	tx, err := d.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var iso, tz, mode string
	if err := tx.(mysql.Tx).QueryRowContext(context.Background(), "SELECT @@tx_isolation, @@time_zone, @@sql_mode").Scan(&iso, &tz, &mode); err != nil {
		t.Fatal(err)
	}
	if iso != "READ-COMMITTED" || tz != "+00:00" || !strings.Contains(mode, "STRICT_ALL_TABLES") {
		t.Fatalf("session: isolation %s, time zone %s, sql_mode %s", iso, tz, mode)
	}
	if !strings.Contains(d.Version(), "MariaDB") || d.Claim() != mysql.ClaimReturning {
		t.Fatalf("server %s got claim strategy %d, want ClaimReturning", d.Version(), d.Claim())
	}
}

// A claim that waits past innodb_lock_wait_timeout for another
// transaction's claim of the same id fails with 1205: transient.
func TestLockWaitTimeoutIsTransient(t *testing.T) {
	d, db := open(t)
	in := newInbox(t, d, db)
	if err := in.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	holder, _ := d.Begin(ctx)
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := in.Claim(ctx, holder, []inbox.Claim{{MessageID: "a"}}); err != nil {
		t.Fatal(err)
	}
	waiter, _ := d.Begin(ctx)
	defer func() { _ = waiter.Rollback(ctx) }()
	if _, err := waiter.(mysql.Tx).ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
		t.Fatal(err)
	}
	_, err := in.Claim(ctx, waiter, []inbox.Claim{{MessageID: "a"}})
	var me *driver.MySQLError
	if !errors.As(err, &me) || me.Number != 1205 {
		t.Fatalf("claim behind a held id = %v; want error 1205", err)
	}
	if c, _ := d.Classify(err); c != sink.ClassUnavailable {
		t.Fatalf("1205 classified %d, want ClassUnavailable", c)
	}
}

// Real errors of a broken sink and of a bad value are told apart.
func TestClassifyRealErrors(t *testing.T) {
	d, db := open(t)
	exec(t, d, "CREATE TABLE `"+db+"`.events (event_id VARCHAR(4))")
	apply := func(table, body string) error {
		eff, err := d.Effect(config.Effect{Append: &config.Append{Table: table, Columns: map[string]string{"event_id": "$.id"}}}, db, nil)
		if err != nil {
			t.Fatal(err)
		}
		tx, _ := d.Begin(context.Background())
		defer func() { _ = tx.Rollback(context.Background()) }()
		m := extract.NewMessage(source.Message{Body: []byte(body)})
		_, err = eff.Apply(context.Background(), tx, []*effect.Record{m})
		return err
	}
	for _, c := range []struct {
		table, body string
		class       sink.Class
		reason      string
	}{
		{"missing", `{"id":"a"}`, sink.ClassSink, "undefined_table"},
		{"events", `{"id":"too long"}`, sink.ClassData, ""},
	} {
		err := apply(c.table, c.body)
		if class, reason := d.Classify(err); class != c.class || reason != c.reason {
			t.Errorf("%s %s: %v classified (%d, %q), want (%d, %q)", c.table, c.body, err, class, reason, c.class, c.reason)
		}
	}
	for n, want := range map[uint16]sink.Class{1213: sink.ClassUnavailable, 1205: sink.ClassUnavailable, 1146: sink.ClassSink,
		1142: sink.ClassSink, 1406: sink.ClassData, 1062: sink.ClassData, 9999: sink.ClassMessages} {
		if got, _ := mysql.Classify(&driver.MySQLError{Number: n}); got != want {
			t.Errorf("error %d classified %d, want %d", n, got, want)
		}
	}
}

// The gate lives in the statement: a newer version another transaction
// commits between the pre-read and the write is kept, an older one is
// overwritten, and the counts say what happened.
func TestUpsertGateAgainstConcurrentInsert(t *testing.T) {
	d, db := open(t)
	exec(t, d, "CREATE TABLE `"+db+"`.orders (order_id VARCHAR(64) PRIMARY KEY, status TEXT, version BIGINT)")
	eff, err := d.Effect(config.Effect{Upsert: &config.Upsert{Table: "orders", Key: []string{"order_id"}, SequenceColumn: "version",
		Columns: map[string]string{"order_id": "$.id", "status": "$.status", "version": "$.v"}}}, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key            string
		concurrent     int
		applied, stale int
		want           string
	}{
		{"newer", 9, 0, 1, "theirs 9"},
		{"older", 1, 1, 0, "ours 5"},
	} {
		mysql.SetAfterPreRead(func() {
			exec(t, d, "INSERT INTO `"+db+"`.orders VALUES ('"+c.key+"', 'theirs', "+string(rune('0'+c.concurrent))+")")
		})
		tx, _ := d.Begin(context.Background())
		m := extract.NewMessage(source.Message{Body: []byte(`{"id":"` + c.key + `","status":"ours","v":5}`)})
		res, err := eff.Apply(context.Background(), tx, []*effect.Record{m})
		mysql.SetAfterPreRead(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
		var status string
		var v int
		if err := d.SQL().QueryRow("SELECT status, version FROM `"+db+"`.orders WHERE order_id = ?", c.key).Scan(&status, &v); err != nil {
			t.Fatal(err)
		}
		if got := status + " " + string(rune('0'+v)); got != c.want || res.Applied != c.applied || res.Stale != c.stale {
			t.Errorf("%s: row %q, applied %d stale %d; want %q, applied %d stale %d", c.key, got, res.Applied, res.Stale, c.want, c.applied, c.stale)
		}
	}
}

// Names follow MySQL: 64 characters kept, derived names shortened to fit,
// anything else refused before a statement is built.
func TestIdentifiers(t *testing.T) {
	d, db := open(t)
	long := strings.Repeat("a", 64)
	in, err := d.Inbox(config.Sink{Schema: db, InboxTable: long, Layout: config.LayoutTable})
	if err != nil {
		t.Fatalf("a 64-character inbox: %v", err)
	}
	for _, n := range in.(*mysql.Inbox).Names().Tables() {
		if len(n) > mysql.MaxIdentifier {
			t.Errorf("derived name %s is %d characters", n, len(n))
		}
	}
	if err := in.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate with 64-character names: %v", err)
	}
	for _, bad := range []string{long + "a", "Inbox", "in`box", "1inbox", ""} {
		if _, err := d.Inbox(config.Sink{Schema: db, InboxTable: bad, Layout: config.LayoutTable}); err == nil {
			t.Errorf("inbox %q accepted", bad)
		}
	}
	// Partitioned (its claim-lock table's derived name included) at 64.
	long2 := strings.Repeat("p", mysql.MaxIdentifier)
	parts, err := d.Inbox(config.Sink{Schema: db, InboxTable: long2, Layout: config.LayoutPartitioned})
	if err != nil {
		t.Fatalf("Partitioned with a 64-character name: %v", err)
	}
	if err := parts.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate Partitioned with 64-character names: %v", err)
	}
	if err := parts.EnsurePartitions(context.Background(), time.Now(), 2); err != nil {
		t.Fatalf("EnsurePartitions with 64-character names: %v", err)
	}
}

// DDL is not transactional: a migration that died between its steps (here:
// the window table never created, the meta row never written) is completed
// by the next pass; a truncated inbox table is a lost epoch.
func TestMigrationResumesAndTruncationIsLoss(t *testing.T) {
	d, db := open(t)
	ctx := context.Background()
	in := newInbox(t, d, db)
	id, err := in.MigrateFor(ctx, &inbox.OwnerClaim{Owner: inbox.Owner{Cluster: "c", Namespace: "n", Name: "a", UID: "u"}})
	if err != nil {
		t.Fatal(err)
	}
	exec(t, d, "DROP TABLE `"+db+"`.inbox_orders_window", "DELETE FROM `"+db+"`.inbox_orders_meta")
	if v, _ := in.SchemaVersion(ctx); v != 0 {
		t.Fatalf("without its meta row the inbox reads as version %d, want 0 (not migrated)", v)
	}
	if err := in.Migrate(ctx); err != nil {
		t.Fatalf("Migrate after the crash: %v", err)
	}
	if v, _ := in.SchemaVersion(ctx); v != inbox.SchemaVersion {
		t.Fatalf("version %d after the resumed migration", v)
	}
	if _, err := in.UpdateWindow(ctx, func(*inbox.WindowState) (*inbox.WindowState, error) {
		return &inbox.WindowState{Window: time.Hour, AdoptedAt: time.Now()}, nil
	}); err != nil {
		t.Fatalf("the window table was not re-created: %v", err)
	}
	fresh, err := in.MigrateFor(ctx, nil)
	if err != nil || fresh.Epoch == "" {
		t.Fatalf("identity after the resumed migration: %+v, %v", fresh, err)
	}
	runtime := newInbox(t, d, db, inbox.WithExpectedEpoch(fresh.Epoch)).(*mysql.Inbox)
	if err := runtime.Verify(ctx); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	exec(t, d, "TRUNCATE TABLE `"+db+"`.inbox_orders")
	if err := runtime.Verify(ctx); !inbox.IsLost(err) || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("Verify after TRUNCATE = %v; want a LostError saying truncated", err)
	}
	if err := runtime.Migrate(ctx); !inbox.IsLost(err) {
		t.Fatalf("the runtime's Migrate after TRUNCATE = %v; want a LostError, never a silent re-creation", err)
	}
	_ = id
}

// A batch of a sequence-gated upsert costs three statements inside its
// transaction (claim, pre-read, write), each one round trip: nothing is
// prepared on the server (the driver interpolates the arguments).
func TestStatementsPerBatch(t *testing.T) {
	d, db := open(t)
	ctx := context.Background()
	exec(t, d, "CREATE TABLE `"+db+"`.orders (order_id VARCHAR(64) PRIMARY KEY, status TEXT, version BIGINT)")
	in := newInbox(t, d, db)
	if err := in.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	eff, err := d.Effect(config.Effect{Upsert: &config.Upsert{Table: "orders", Key: []string{"order_id"}, SequenceColumn: "version",
		Columns: map[string]string{"order_id": "$.id", "status": "$.status", "version": "$.v"}}}, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, _ := d.Begin(ctx)
	defer func() { _ = tx.Rollback(ctx) }()
	counters := func() (questions, prepares int) {
		rows, err := tx.(mysql.Tx).QueryContext(ctx, "SHOW SESSION STATUS WHERE Variable_name IN ('Questions', 'Com_stmt_prepare')")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = rows.Close() }()
		for rows.Next() {
			var name string
			var v int
			if err := rows.Scan(&name, &v); err != nil {
				t.Fatal(err)
			}
			if name == "Questions" {
				questions = v
			} else {
				prepares = v
			}
		}
		return questions, prepares
	}
	q0, _ := counters()
	q1, p1 := counters() // the SHOW itself counts once
	var claims []inbox.Claim
	var recs []*effect.Record
	for i := range 50 {
		id := string(rune('a'+i%26)) + string(rune('a'+i/26))
		claims = append(claims, inbox.Claim{MessageID: id})
		m := extract.NewMessage(source.Message{Body: []byte(`{"id":"` + id + `","status":"s","v":1}`)})
		m.ID = id
		recs = append(recs, m)
	}
	if _, err := in.Claim(ctx, tx, claims); err != nil {
		t.Fatal(err)
	}
	if _, err := eff.Apply(ctx, tx, recs); err != nil {
		t.Fatal(err)
	}
	q2, p2 := counters()
	if got := (q2 - q1) - (q1 - q0); got != 3 || p2 != p1 {
		t.Fatalf("a 50-message batch ran %d statements and %d prepares; want 3 and 0", got, p2-p1)
	}
}

// ClaimCount (MySQL 8's claim) never takes an id another transaction
// claimed between its read and its insert for new: the count gives it away,
// and the claim fails transient, even when the DSN asks for found rows
// (which would count the untouched duplicate as inserted).
func TestCountingClaimRace(t *testing.T) {
	name, dsn := mysqltest.NewDatabase(t)
	d, err := mysql.Open(context.Background(), dsn+"?clientFoundRows=true", mysql.WithClaimStrategy(mysql.ClaimCount))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	ctx := context.Background()
	in := newInbox(t, d, name)
	if err := in.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	mysql.SetAfterClaimRead(func() {
		exec(t, d, "INSERT INTO `"+name+"`.inbox_orders (message_id) VALUES ('b')")
	})
	defer mysql.SetAfterClaimRead(nil)
	tx, _ := d.Begin(ctx)
	defer func() { _ = tx.Rollback(ctx) }()
	fresh, err := in.Claim(ctx, tx, []inbox.Claim{{MessageID: "a"}, {MessageID: "b"}})
	if !errors.Is(err, mysql.ErrClaimRace) {
		t.Fatalf("claim racing a committed claim of b = %v, %v; want ErrClaimRace", fresh, err)
	}
	if c, _ := d.Classify(err); c != sink.ClassUnavailable {
		t.Fatalf("ErrClaimRace classified %d, want ClassUnavailable", c)
	}
}
