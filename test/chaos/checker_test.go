package chaos

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// PostgreSQL's sink tables, all in schema chaos (MariaDB's:
// mariadb_test.go). The append consumer writes one events
// row per applied message and has no unique constraint, so a double
// application is a second row; the upsert consumer keeps one orders row per
// key behind the sequence gate, and a trigger logs every change it makes.
const (
	appendInbox = "inbox_append"
	upsertInbox = "inbox_upsert"
)

var schemaDDL = []string{
	"CREATE SCHEMA chaos",
	`CREATE TABLE chaos.events (seq bigserial PRIMARY KEY, event_id text NOT NULL, key text NOT NULL,
		version int NOT NULL, n int NOT NULL)`,
	`CREATE TABLE chaos.orders (key text PRIMARY KEY, version int NOT NULL, status text NOT NULL,
		event_id text NOT NULL)`,
	"CREATE TABLE chaos.order_changes (key text NOT NULL, old_version int, new_version int NOT NULL)",
	`CREATE FUNCTION chaos.log_change() RETURNS trigger LANGUAGE plpgsql AS $$
	 BEGIN
	   INSERT INTO chaos.order_changes VALUES (NEW.key, CASE WHEN TG_OP = 'UPDATE' THEN OLD.version END, NEW.version);
	   RETURN NEW;
	 END $$`,
	"CREATE TRIGGER log_change AFTER INSERT OR UPDATE ON chaos.orders FOR EACH ROW EXECUTE FUNCTION chaos.log_change()",
}

// verdict is what the checker proved, from the database and the list of
// published events alone.
type verdict struct {
	unique  int // distinct event ids published
	applied int // published ids with an effect row in chaos.events
	doubled int // ids with more than one effect row
	lost    int // ids missing from an inbox and its dead letters, or without effect and not dead-lettered
	stale   int // keys not at the state of their highest published version, plus backward row changes
	// Not in the CHAOS line, still failures:
	phantom     int // effect or inbox rows for ids never published
	deadLetters int // every published message is well-formed: none is expected
	backwards   int // row changes the gate let through that did not move a key forward (part of stale)
}

// check loads the published events into chaos.published and runs the
// queries. It reads nothing from the runtime's metrics or logs.
func (db *database) check(ctx context.Context, published []event) (verdict, error) {
	if err := loadPublished(ctx, db, published); err != nil {
		return verdict{}, err
	}
	var v verdict
	var staleKeys int
	for _, q := range []struct {
		dst *int
		sql string
	}{
		{&v.unique, "SELECT count(*) FROM chaos.published"},
		{&v.applied, "SELECT count(DISTINCT e.event_id) FROM chaos.events e JOIN chaos.published p USING (event_id)"},
		{&v.doubled, "SELECT count(*) FROM (SELECT event_id FROM chaos.events GROUP BY 1 HAVING count(*) > 1) d"},
		{&v.lost, lostSQL},
		{&staleKeys, staleSQL},
		{&v.backwards, "SELECT count(*) FROM chaos.order_changes WHERE old_version >= new_version"},
		{&v.phantom, phantomSQL},
		{&v.deadLetters, "SELECT (SELECT count(*) FROM chaos." + appendInbox + "_dead_letters) + (SELECT count(*) FROM chaos." + upsertInbox + "_dead_letters)"},
	} {
		n, err := db.queryInt(ctx, q.sql)
		if err != nil {
			return v, err
		}
		*q.dst = n
	}
	v.stale = staleKeys + v.backwards
	return v, nil
}

// inInboxOrDead is true when the id was claimed or dead-lettered by the
// consumer of the given inbox.
func inInboxOrDead(inbox string) string {
	return `(EXISTS (SELECT 1 FROM chaos.` + inbox + ` i WHERE i.message_id = p.event_id)
	      OR EXISTS (SELECT 1 FROM chaos.` + inbox + `_dead_letters d WHERE d.message_id = p.event_id))`
}

// lostSQL: a published id is lost when either consumer has neither claimed
// nor dead-lettered it, or when the append consumer has no effect row for
// it and did not dead-letter it (a claim committed without its effect).
var lostSQL = `SELECT count(*) FROM chaos.published p
	WHERE NOT ` + inInboxOrDead(appendInbox) + `
	   OR NOT ` + inInboxOrDead(upsertInbox) + `
	   OR NOT (EXISTS (SELECT 1 FROM chaos.events e WHERE e.event_id = p.event_id)
	        OR EXISTS (SELECT 1 FROM chaos.` + appendInbox + `_dead_letters d WHERE d.message_id = p.event_id))`

// staleSQL: keys whose row is missing, below the highest published version,
// or not exactly the event that published that version.
const staleSQL = `SELECT count(*) FROM (SELECT key, max(version) AS top FROM chaos.published GROUP BY key) h
	LEFT JOIN chaos.orders o USING (key)
	WHERE o.key IS NULL OR o.version < h.top
	   OR NOT EXISTS (SELECT 1 FROM chaos.published p
	                  WHERE p.event_id = o.event_id AND p.key = o.key AND p.version = o.version AND p.status = o.status)`

var phantomSQL = `SELECT (SELECT count(*) FROM chaos.events e WHERE NOT EXISTS (SELECT 1 FROM chaos.published p WHERE p.event_id = e.event_id))
	+ (SELECT count(*) FROM chaos.` + appendInbox + ` i WHERE NOT EXISTS (SELECT 1 FROM chaos.published p WHERE p.event_id = i.message_id))
	+ (SELECT count(*) FROM chaos.` + upsertInbox + ` i WHERE NOT EXISTS (SELECT 1 FROM chaos.published p WHERE p.event_id = i.message_id))`

func loadPublished(ctx context.Context, db *database, published []event) error {
	if _, err := db.pool.Exec(ctx, `CREATE TABLE chaos.published (event_id text PRIMARY KEY, key text NOT NULL,
		version int NOT NULL, status text NOT NULL)`); err != nil {
		return fmt.Errorf("creating chaos.published: %w", err)
	}
	rows := make([][]any, len(published))
	for i, e := range published {
		rows[i] = []any{e.EventID, e.Key, e.Version, e.Status}
	}
	_, err := db.pool.CopyFrom(ctx, pgx.Identifier{"chaos", "published"}, []string{"event_id", "key", "version", "status"},
		pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("loading chaos.published: %w", err)
	}
	for _, stmt := range []string{"CREATE INDEX ON chaos.events (event_id)", "ANALYZE"} {
		if _, err := db.pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("preparing the checks (%s): %w", stmt, err)
		}
	}
	return nil
}

func (v verdict) line(kills, published int, dialect string) string {
	return fmt.Sprintf("CHAOS kills=%d published=%d unique=%d applied=%d doubled=%d lost=%d stale=%d db=%s",
		kills, published, v.unique, v.applied, v.doubled, v.lost, v.stale, dialect)
}
