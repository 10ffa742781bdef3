// Package inbox owns the PostgreSQL inbox of one consumer: the table of
// processed message ids (claimed in the same transaction as the effect), the
// dead-letter table, the prune-runs and redrives logs and the schema version. Every
// identifier comes from the config and is still quoted with pgx.Identifier.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// SchemaVersion is the version of the DDL this package writes; it is stored
// in the <inbox>_meta table and reported in status.inbox.schemaVersion.
//
// 2 added the payload fingerprint of every claimed id (id conflicts) and
// the redrives and id-conflicts tables; migrating from 1 is online (a
// nullable column, no rewrite) and idempotent.
//
// 3 added the <inbox>_outbox table (spec.emit); migrating from 2 only
// creates tables and an index, so it is online and idempotent too.
//
// 4 added the outbox's headers, order_key, attempts and last_error columns
// (emit.headers, http delivery: Outbox); nullable columns and a constant
// default, so migrating from 3 is a catalog change only.
//
// 5 added the <inbox>_progress table (each replica's heartbeat and oldest
// unacknowledged claim, which bound the prune cutoff), the <inbox>_window
// table (the adopted retention window and its pending shrink, kept beside
// the data so a re-created resource keeps them) and the held-back columns
// of <inbox>_prune_runs; new tables and nullable columns only, so
// migrating from 4 is online too.
//
// 6 creates the <inbox>_outbox and <inbox>_redrives tables only when the
// inbox uses them (WithOutbox: spec.emit or http delivery: Outbox;
// WithRedrives: a redrive run), so an inbox that never emits nor redrives
// carries 13 relations fewer (tables, sequences, indexes, TOAST) and is
// provisioned about a third faster. Migrating from 5 changes nothing in
// place: the tables a 5 inbox has are kept and upgraded as before.
//
// 7 records the inbox's owner (cluster, namespace, name, UID) and epoch in
// the meta row, and the epoch's marker row in the inbox table (identity.go).
// Migrating from 5 or 6 adds nullable columns to the one-row meta table and
// inserts one row: no claim waits on it.
const SchemaVersion = 7

// maxIdentifier is PostgreSQL's NAMEDATALEN-1: longer names are truncated
// silently, which would make derived names collide.
const maxIdentifier = 63

// Querier is what read-only helpers need: a pool, a connection or a tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Names are the unquoted table names of one inbox.
type Names struct {
	Schema      string
	Inbox       string
	DeadLetters string
	PruneRuns   string
	Redrives    string
	IDConflicts string
	Outbox      string
	Meta        string
	Progress    string
	Window      string
}

// NamesFor derives the table names from the sink config. Derived names that
// would exceed 63 bytes are shortened with a hash so they stay distinct.
func NamesFor(sink config.Sink) Names { return namesFor(sink, maxIdentifier) }

func namesFor(sink config.Sink, max int) Names {
	DerivedName := func(base, suffix string) string { return derivedName(base, suffix, max) }
	dl := sink.DeadLetterTable
	if dl == "" {
		dl = DerivedName(sink.InboxTable, "_dead_letters")
	}
	return Names{
		Schema:      sink.Schema,
		Inbox:       sink.InboxTable,
		DeadLetters: dl,
		PruneRuns:   DerivedName(sink.InboxTable, "_prune_runs"),
		Redrives:    DerivedName(sink.InboxTable, "_redrives"),
		IDConflicts: DerivedName(sink.InboxTable, "_id_conflicts"),
		Outbox:      DerivedName(sink.InboxTable, "_outbox"),
		Meta:        DerivedName(sink.InboxTable, "_meta"),
		Progress:    DerivedName(sink.InboxTable, "_progress"),
		Window:      DerivedName(sink.InboxTable, "_window"),
	}
}

// Tables lists every table an inbox may have (the dead-letter table and the
// optional ones included; partitions of a Partitioned inbox are not
// listed): the names admission reserves.
func (n Names) Tables() []string {
	return []string{n.Inbox, n.DeadLetters, n.PruneRuns, n.Redrives, n.IDConflicts, n.Outbox, n.Meta, n.Progress, n.Window}
}

// Provisioned lists the tables Migrate creates for an inbox with these
// options: every table but the optional ones it does not use.
func (n Names) Provisioned(o Options) []string {
	out := make([]string, 0, 9)
	for _, t := range n.Tables() {
		if (t == n.Outbox && !o.Outbox) || (t == n.Redrives && !o.Redrives) {
			continue
		}
		out = append(out, t)
	}
	return out
}

// Options are the optional tables an inbox uses. Migrate creates them when
// asked and keeps (and upgrades) them once they exist; a store without the
// option never creates them.
type Options struct {
	// Outbox: the <inbox>_outbox table (config.UsesOutbox).
	Outbox bool
	// Redrives: the <inbox>_redrives log, which a redrive run writes.
	Redrives bool
	// Epoch, when set, is the epoch the inbox must hold (the runtime's
	// config): Migrate refuses to create or adopt anything else, and
	// Verify reports a *LostError when it no longer holds it.
	Epoch string
}

// Option sets one of Options.
type Option func(*Options)

// WithOutbox makes Migrate create the outbox table when on is true.
func WithOutbox(on bool) Option { return func(o *Options) { o.Outbox = on } }

// WithExpectedEpoch makes the store expect the inbox of epoch (see
// Options.Epoch); "" expects none.
func WithExpectedEpoch(epoch string) Option { return func(o *Options) { o.Epoch = epoch } }

// WithRedrives makes Migrate create the redrives log.
func WithRedrives() Option { return func(o *Options) { o.Redrives = true } }

// DerivedName is base+suffix, with base cut and tagged with a short hash when
// the result would be longer than PostgreSQL keeps.
func DerivedName(base, suffix string) string { return derivedName(base, suffix, maxIdentifier) }

func derivedName(base, suffix string, max int) string {
	if len(base)+len(suffix) <= max {
		return base + suffix
	}
	tag := fmt.Sprintf("_%08x", crc32.ChecksumIEEE([]byte(base)))
	return base[:max-len(suffix)-len(tag)] + tag + suffix
}

// Store is the inbox of one consumer.
type Store struct {
	pool   *pgxpool.Pool
	layout config.Layout
	names  Names
	opts   Options
	// expectEpoch is opts.Epoch.
	expectEpoch string

	inbox, deadLetters, pruneRuns, redrives, idConflicts, outbox, meta, progress, window string // quoted, schema-qualified
	// lockKey scopes advisory locks to this inbox, so two inboxes in one
	// database never wait on each other.
	lockKey int32

	partitions partitionCache
}

// New returns the store of the inbox described by the sink config; opts
// name the optional tables it uses.
func New(pool *pgxpool.Pool, sink config.Sink, opts ...Option) (*Store, error) {
	if sink.Layout != config.LayoutTable && sink.Layout != config.LayoutPartitioned {
		return nil, fmt.Errorf("while opening inbox: unknown layout %q", sink.Layout)
	}
	if sink.Schema == "" || sink.InboxTable == "" {
		return nil, errors.New("while opening inbox: schema and inbox table are required")
	}
	n := NamesFor(sink)
	var o Options
	for _, opt := range opts {
		opt(&o)
	}
	return &Store{
		pool:        pool,
		layout:      sink.Layout,
		names:       n,
		opts:        o,
		expectEpoch: o.Epoch,
		inbox:       qualify(n.Schema, n.Inbox),
		deadLetters: qualify(n.Schema, n.DeadLetters),
		pruneRuns:   qualify(n.Schema, n.PruneRuns),
		redrives:    qualify(n.Schema, n.Redrives),
		idConflicts: qualify(n.Schema, n.IDConflicts),
		outbox:      qualify(n.Schema, n.Outbox),
		meta:        qualify(n.Schema, n.Meta),
		progress:    qualify(n.Schema, n.Progress),
		window:      qualify(n.Schema, n.Window),
		lockKey:     int32(crc32.ChecksumIEEE([]byte(n.Schema + "." + n.Inbox))),
		partitions:  partitionCache{known: map[time.Time]bool{}},
	}, nil
}

// ForConfig is New for a runtime config: the outbox table when the config
// uses one (spec.emit, http delivery: Outbox), the epoch the controller
// recorded (the inbox it provisioned is the only one to claim into), plus
// opts.
func ForConfig(pool *pgxpool.Pool, cfg *config.Config, opts ...Option) (*Store, error) {
	return New(pool, cfg.Sink, append([]Option{WithOutbox(cfg.UsesOutbox()), WithExpectedEpoch(cfg.Sink.InboxEpoch)}, opts...)...)
}

// Names returns the table names of this inbox.
func (s *Store) Names() Names { return s.names }

// Layout returns the inbox layout.
func (s *Store) Layout() config.Layout { return s.layout }

// QualifiedInbox is the quoted "schema"."table" of the inbox.
func (s *Store) QualifiedInbox() string { return s.inbox }

func qualify(schema, table string) string { return pgx.Identifier{schema, table}.Sanitize() }

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// inTx runs fn in a transaction holding this inbox's DDL advisory lock, so
// replicas that migrate or create partitions at once take turns.
func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1::int, 0)", s.lockKey); err != nil {
			return fmt.Errorf("while taking the inbox DDL lock: %w", err)
		}
		return fn(tx)
	})
}

// execAll runs the statements in one round trip (the simple query
// protocol takes several at once), inside the caller's transaction. The
// error is PostgreSQL's, which names the table or privilege at fault.
func execAll(ctx context.Context, tx pgx.Tx, stmts []string) error {
	if len(stmts) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, strings.Join(stmts, ";\n")); err != nil {
		return fmt.Errorf("while running %d DDL statements: %w", len(stmts), err)
	}
	return nil
}
