package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// TestVersionSkew runs the real idc-runtime against inboxes of another
// schema version than its own (docs/operate.md, "Version skew"):
//   - a runtime older than the inbox's schema (the meta row records
//     SchemaVersion+1, as a newer release would) refuses to start, exits 3
//     naming both versions and what to do, and writes nothing: no DDL, no
//     claim, no effect, no acknowledgement;
//   - a runtime newer than the inbox's schema (an inbox a release of
//     schema version 6 left: no owner or epoch columns in its meta row, no
//     consumer column in its progress table) migrates it itself at start,
//     keeps the claims the old runtime made, and consumes.
func TestVersionSkew(t *testing.T) {
	bin := buildBinary(t)
	t.Run("OlderRuntimeRefusesANewerSchema", func(t *testing.T) { olderRuntimeRefuses(t, bin) })
	t.Run("NewerRuntimeMigratesAnOlderSchema", func(t *testing.T) { newerRuntimeMigrates(t, bin) })
}

// inboxShape is what the runtime could have changed in the app schema:
// every column of every table, and the triggers.
func inboxShape(t *testing.T, db *database) string {
	t.Helper()
	var shape string
	err := db.pool.QueryRow(context.Background(), `SELECT string_agg(table_name || '.' || column_name || ':' || data_type, ',' ORDER BY table_name, ordinal_position)
		FROM information_schema.columns WHERE table_schema = 'app'`).Scan(&shape)
	if err != nil {
		t.Fatal(err)
	}
	var triggers int
	if err := db.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal`).Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s triggers=%d", shape, triggers)
}

func olderRuntimeRefuses(t *testing.T, bin string) {
	b := newJetStream(t, 5*time.Second)
	db := newDatabase(t)
	db.exec(t, "CREATE SCHEMA app", effectsTable)
	cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
	migrateInbox(t, db, cfg)
	newer := inbox.SchemaVersion + 1
	db.exec(t, fmt.Sprintf("UPDATE app.inbox_orders_meta SET schema_version = %d, migrated_at = '2026-01-01T00:00:00Z'", newer))
	before := inboxShape(t, db)
	var msgs []outgoing
	for _, e := range plainEvents(200) {
		msgs = append(msgs, e.outgoing())
	}
	b.publish(t, msgs)

	p := startBinary(t, bin, cfg)
	st := p.wait(t, 30*time.Second)
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || ws.Signaled() || st.ExitCode() != 3 {
		t.Fatalf("exit state %s, want exit code 3 (refused)", st)
	}
	logs := p.logs.String()
	for _, want := range []string{
		fmt.Sprintf("has schema version %d, newer than the %d this binary knows", newer, inbox.SchemaVersion),
		"run that release's runtime image or a newer one", `docs/operate.md, \"Version skew\"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("the logs lack %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, `"msg":"Startup step failed; retrying"`) {
		t.Errorf("the refusal was retried as if it were an outage")
	}
	if after := inboxShape(t, db); after != before {
		t.Errorf("the refused runtime changed the schema:\nbefore %s\nafter  %s", before, after)
	}
	var version int
	var migratedAt time.Time
	if err := db.pool.QueryRow(context.Background(), "SELECT schema_version, migrated_at FROM app.inbox_orders_meta").Scan(&version, &migratedAt); err != nil {
		t.Fatal(err)
	}
	if version != newer || !migratedAt.Equal(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("meta row rewritten: schema_version %d migrated_at %s", version, migratedAt)
	}
	for table, q := range map[string]string{
		"effects": "SELECT count(*) FROM app.effects", "inbox": "SELECT count(*) FROM app.inbox_orders",
		"progress": "SELECT count(*) FROM app.inbox_orders_progress",
	} {
		if n := db.queryInt(t, q); n != 0 {
			t.Errorf("%d rows written into %s", n, table)
		}
	}
	info, err := b.info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Delivered.Consumer != 0 || info.AckFloor.Consumer != 0 {
		t.Errorf("the refused runtime consumed: delivered %d, acked %d", info.Delivered.Consumer, info.AckFloor.Consumer)
	}
	// `idc-runtime migrate` (what a person or a Job runs) refuses the same
	// way, and changes nothing either.
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "migrate", "--config", path).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || !strings.Contains(string(out), fmt.Sprintf("has schema version %d", newer)) {
		t.Errorf("idc-runtime migrate against schema %d: %v, want exit 3 and the refusal:\n%s", newer, err, out)
	}
	if after := inboxShape(t, db); after != before {
		t.Errorf("idc-runtime migrate changed the schema:\nbefore %s\nafter  %s", before, after)
	}
	line := logs[strings.Index(logs, "has schema version")-60:]
	t.Logf("SKEW old runtime (schema %d) vs inbox schema %d: exit %d, nothing written; logged: ...%s", inbox.SchemaVersion, newer, st.ExitCode(), line[:min(len(line), 420)])
}

func newerRuntimeMigrates(t *testing.T, bin string) {
	b := newJetStream(t, 5*time.Second)
	db := newDatabase(t)
	db.exec(t, "CREATE SCHEMA app", effectsTable)
	cfg := appendConfig(b.sourceConfig(), dsnEnvFor(t, db))
	migrateInbox(t, db, cfg)
	// The inbox as a schema-6 release left it (migrate.go: metaUpgradeDDL,
	// progressUpgradeDDL and the epoch's truncation trigger are 7's), with
	// the claims its runtime made: ids 0..99 applied already.
	db.exec(t,
		"DROP TRIGGER idc_inbox_truncated ON app.inbox_orders",
		"DROP FUNCTION app.inbox_orders_truncated()",
		`ALTER TABLE app.inbox_orders_meta DROP COLUMN owner_cluster, DROP COLUMN owner_namespace, DROP COLUMN owner_name,
			DROP COLUMN owner_uid, DROP COLUMN epoch`,
		"ALTER TABLE app.inbox_orders_progress DROP COLUMN consumer",
		"UPDATE app.inbox_orders_meta SET schema_version = 6",
		"INSERT INTO app.inbox_orders (message_id) SELECT format('evt-%s', lpad(i::text, 6, '0')) FROM generate_series(0, 99) i",
		"INSERT INTO app.effects (message_id, n) SELECT format('evt-%s', lpad(i::text, 6, '0')), i FROM generate_series(0, 99) i",
	)
	const total = 1000
	var msgs []outgoing
	for _, e := range plainEvents(total) {
		msgs = append(msgs, e.outgoing())
	}
	b.publish(t, msgs)

	p := startBinary(t, bin, cfg)
	p.waitStatus(t, "/readyz", 200, 30*time.Second)
	waitFor(t, 60*time.Second, "every message applied", func() error {
		if n := db.queryInt(t, "SELECT count(*) FROM app.effects"); n < total {
			return fmt.Errorf("%d of %d effects", n, total)
		}
		return nil
	})
	waitFor(t, 30*time.Second, "a progress record with its consumer", func() error {
		if n := db.queryInt(t, "SELECT count(*) FROM app.inbox_orders_progress WHERE consumer IS NOT NULL"); n == 0 {
			return fmt.Errorf("no progress row records its consumer yet")
		}
		return nil
	})
	expectCleanExit(t, p, p.terminate(t))
	checkExactlyOnce(t, db, b, total)
	version := db.queryInt(t, "SELECT schema_version FROM app.inbox_orders_meta")
	epochs := db.queryInt(t, "SELECT count(*) FROM app.inbox_orders_meta WHERE epoch IS NOT NULL")
	if version != inbox.SchemaVersion || epochs != 1 {
		t.Fatalf("after the newer runtime: schema_version %d (want %d), %d epochs minted (want 1)", version, inbox.SchemaVersion, epochs)
	}
	t.Logf("SKEW new runtime (schema %d) vs inbox schema 6: migrated itself to %d at start, epoch minted, %d effects for %d ids (100 claimed by the old runtime kept), 0 doubled",
		inbox.SchemaVersion, version, db.queryInt(t, "SELECT count(*) FROM app.effects"), total)
}
