package mysql_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// The outbox, its shard rows and the redrives log follow MySQL's names
// too: with a 64-character inbox every derived table and index name fits,
// and the tables are created and dropped.
func TestOutboxTablesWithLongNames(t *testing.T) {
	d, db := open(t)
	c := context.Background()
	long := strings.Repeat("b", 64)
	in, err := d.Inbox(config.Sink{Schema: db, InboxTable: long, Layout: config.LayoutTable}, inbox.WithOutbox(true), inbox.WithRedrives())
	if err != nil {
		t.Fatalf("a 64-character inbox with the outbox: %v", err)
	}
	if err := in.Migrate(c); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	tables := func() map[string]bool {
		rows, err := d.SQL().QueryContext(c, `SELECT table_name FROM information_schema.tables WHERE table_schema = ?`, db)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = rows.Close() }()
		out := map[string]bool{}
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			out[n] = true
		}
		return out
	}
	got := tables()
	n := in.Names()
	for _, want := range []string{n.Outbox, n.Redrives, inbox.DerivedNameMax(n.Outbox, "_shards", 64)} {
		if !got[want] {
			t.Errorf("table %s not created (have %v)", want, got)
		}
	}
	// Idempotent: a second Migrate seeds nothing twice.
	if err := in.Migrate(c); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	var shards int
	if err := d.SQL().QueryRowContext(c, "SELECT COUNT(*) FROM `"+db+"`.`"+inbox.DerivedNameMax(n.Outbox, "_shards", 64)+"`").Scan(&shards); err != nil || shards != inbox.OutboxShards {
		t.Errorf("%d shard rows (%v), want %d", shards, err, inbox.OutboxShards)
	}
	if err := in.Drop(c); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	if left := tables(); len(left) != 0 {
		t.Errorf("tables left after Drop: %v", left)
	}
}

// The sql effect refuses MySQL's positional ? (it would misnumber the
// :name placeholders), as PostgreSQL's refuses $n.
func TestSQLEffectRefusesPositional(t *testing.T) {
	d, db := open(t)
	_, err := d.Effect(config.Effect{SQL: &config.SQL{Statement: "UPDATE t SET a = ? WHERE b = :b", Params: map[string]string{"b": "$.b"}}}, db, nil)
	if err == nil || !strings.Contains(err.Error(), "positional") {
		t.Fatalf("Effect with ? = %v; want the positional refusal", err)
	}
}
