package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// Inbox is the MySQL inbox of one consumer. Its tables have the shape of
// inbox.SchemaVersion (the same columns as PostgreSQL's, in MySQL types:
// VARBINARY ids compared byte for byte, DATETIME(6) in UTC, JSON).
type Inbox struct {
	d     *DB
	names inbox.Names
	opts  inbox.Options

	inbox, deadLetters, pruneRuns, idConflicts, meta, progress, window string // quoted, qualified

	layout config.Layout
	// claimLocks is the Partitioned layout's claim-lock table (partitions.go).
	claimLocks string
	days       dayCache
	// lockName is this inbox's GET_LOCK name for migrations (at most 64
	// characters).
	lockName string
}

var _ sink.Inbox = (*Inbox)(nil)

// NewInbox returns the inbox the sink config describes; sink.Schema is the
// database. Both layouts run (Partitioned: partitions.go).
func NewInbox(d *DB, s config.Sink, opts ...inbox.Option) (*Inbox, error) {
	if s.Layout != config.LayoutTable && s.Layout != config.LayoutPartitioned {
		return nil, fmt.Errorf("while opening inbox: %w: layout %q", sink.ErrUnsupported, s.Layout)
	}
	n := inbox.NamesForMax(s, MaxIdentifier)
	for _, name := range append([]string{n.Schema}, n.Tables()...) {
		if err := ValidIdentifier(name); err != nil {
			return nil, fmt.Errorf("while opening inbox: %w", err)
		}
	}
	var o inbox.Options
	for _, opt := range opts {
		opt(&o)
	}
	q := func(t string) string { return qualify(n.Schema, t) }
	return &Inbox{
		d: d, names: n, opts: o,
		inbox: q(n.Inbox), deadLetters: q(n.DeadLetters), pruneRuns: q(n.PruneRuns), idConflicts: q(n.IDConflicts),
		meta: q(n.Meta), progress: q(n.Progress), window: q(n.Window),
		layout: s.Layout, claimLocks: q(claimLocksName(n)), days: dayCache{known: map[time.Time]bool{}},
		lockName: fmt.Sprintf("idc-inbox:%08x", crc32.ChecksumIEEE([]byte(n.Schema+"."+n.Inbox))),
	}, nil
}

// Names are the table names.
func (s *Inbox) Names() inbox.Names { return s.names }

// QualifiedInbox is the quoted `database`.`table` of the inbox.
func (s *Inbox) QualifiedInbox() string { return s.inbox }

// Layout is the inbox's layout.
func (s *Inbox) Layout() config.Layout { return s.layout }

// name is the inbox as errors name it.
func (s *Inbox) name() string { return s.names.Schema + "." + s.names.Inbox }

// tablesDDL creates every table but the meta table, each idempotent.
func (s *Inbox) tablesDDL() []string {
	// The inbox table (and its claim locks when Partitioned) first.
	return append(s.inboxDDL(), []string{
		`CREATE TABLE IF NOT EXISTS ` + s.idConflicts + ` (
			id                   BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
			message_id           VARBINARY(1024) NOT NULL,
			native_id            VARBINARY(1024) NULL,
			claimed_fingerprint  BIGINT NOT NULL,
			conflict_fingerprint BIGINT NOT NULL,
			payload              LONGBLOB NULL,
			detected_at          DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))
		) ENGINE=InnoDB`,
		`CREATE TABLE IF NOT EXISTS ` + s.deadLetters + ` (
			id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
			message_id   VARBINARY(1024) NULL,
			native_id    VARBINARY(1024) NULL,
			reason       MEDIUMTEXT NOT NULL,
			payload      LONGBLOB NULL,
			headers      JSON NULL,
			attempts     INT NULL,
			published_at DATETIME(6) NULL,
			dead_at      DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
			reason_class VARCHAR(64) NULL,
			UNIQUE KEY ` + quote(inbox.DerivedNameMax(s.names.DeadLetters, "_native_id_key", MaxIdentifier)) + ` (native_id)
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`,
		`CREATE TABLE IF NOT EXISTS ` + s.pruneRuns + ` (
			id                 BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
			started_at         DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
			finished_at        DATETIME(6) NULL,
			cutoff             DATETIME(6) NOT NULL,
			rows_deleted       BIGINT NOT NULL DEFAULT 0,
			partitions_dropped INT NOT NULL DEFAULT 0,
			window_seconds     BIGINT NOT NULL,
			error              MEDIUMTEXT NULL,
			window_cutoff      DATETIME(6) NULL,
			held_reason        MEDIUMTEXT NULL,
			held_since         DATETIME(6) NULL
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`,
		`CREATE TABLE IF NOT EXISTS ` + s.progress + ` (
			replica        VARCHAR(255) NOT NULL PRIMARY KEY,
			started_at     DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
			heartbeat_at   DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
			last_commit_at DATETIME(6) NULL,
			unacked_since  DATETIME(6) NULL,
			positions      JSON NOT NULL,
			stopped        BOOLEAN NOT NULL DEFAULT FALSE,
			stale_since    DATETIME(6) NULL,
			settle_mark    JSON NULL,
			consumer       JSON NULL
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`,
		`CREATE TABLE IF NOT EXISTS ` + s.window + ` (
			singleton          TINYINT NOT NULL DEFAULT 1 PRIMARY KEY CHECK (singleton = 1),
			window_ms          BIGINT NOT NULL,
			inputs_hash        TEXT NOT NULL,
			source             TEXT NOT NULL,
			derived_from       TEXT NOT NULL,
			redelivery_horizon TEXT NOT NULL,
			replay_horizon     TEXT NOT NULL,
			adopted_at         DATETIME(6) NOT NULL,
			pending_window_ms  BIGINT NULL,
			pending_since      DATETIME(6) NULL,
			updated_at         DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`,
	}...)
}

func (s *Inbox) metaDDL() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.meta + ` (
			singleton       TINYINT NOT NULL DEFAULT 1 PRIMARY KEY CHECK (singleton = 1),
			schema_version  INT NOT NULL,
			layout          VARCHAR(32) NOT NULL,
			migrated_at     DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
			owner_cluster   VARCHAR(255) NULL,
			owner_namespace VARCHAR(255) NULL,
			owner_name      VARCHAR(255) NULL,
			owner_uid       VARCHAR(255) NULL,
			epoch           VARCHAR(255) NULL
		) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`
}

// epochMarker is the inbox row that proves the table still holds the
// claims of epoch: MySQL has no TRUNCATE trigger, so a truncated (or
// re-created) inbox table shows as this row gone. Its id starts with a NUL
// byte, which no real message id has (the consumer refuses them), and its
// processed_at is the far future, so prune never deletes it.
func epochMarker(epoch string) string { return "\x00idc-epoch:" + epoch }

// markerTime is the marker's processed_at.
const markerTime = "9999-12-31 00:00:00"

// migrateLockTimeout bounds the wait for another migrator (seconds).
const migrateLockTimeout = 60

// Migrate creates or upgrades the inbox (see MigrateFor).
func (s *Inbox) Migrate(ctx context.Context) error {
	_, err := s.MigrateFor(ctx, nil)
	return err
}

// MigrateFor migrates without transactional DDL: the steps run one by one
// under GET_LOCK on one connection, each idempotent, the meta row (the
// "migrated" mark) written only after every table exists. A crash anywhere
// leaves tables the next pass finds and a meta row it writes then. The
// identity decisions (lost, another owner's, a new epoch) are
// inbox.State's, shared with PostgreSQL.
func (s *Inbox) MigrateFor(ctx context.Context, c *inbox.OwnerClaim) (_ inbox.Identity, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	var id inbox.Identity
	err = s.withLock(ctx, func(conn *sql.Conn) error {
		st, err := s.readState(ctx, conn)
		if err != nil {
			return err
		}
		if err := st.Refusal(s.name(), s.opts.Epoch, c); err != nil {
			return err
		}
		if st.HasMeta && st.Version > 0 && st.Layout != string(s.layout) {
			return fmt.Errorf("inbox exists with layout %s, config asks for %s: the layout cannot change in place", st.Layout, s.layout)
		}
		if st.Version > inbox.SchemaVersion {
			return fmt.Errorf("inbox schema version %d is newer than this runtime's %d", st.Version, inbox.SchemaVersion)
		}
		// The outbox and redrive tables the options ask for (outbox.go),
		// also on an inbox migrated without them.
		if err := s.migrateOptional(ctx, conn); err != nil {
			return err
		}
		if st.Version != inbox.SchemaVersion || !st.HasInbox {
			for _, stmt := range append(s.tablesDDL(), s.metaDDL()) {
				if _, err := conn.ExecContext(ctx, stmt); err != nil {
					return fmt.Errorf("while creating the inbox tables: %w", err)
				}
			}
			// Upserted: a crash after the meta table but before its row
			// leaves no row; an older version's row is brought up.
			if _, err := conn.ExecContext(ctx, `INSERT INTO `+s.meta+` (singleton, schema_version, layout) VALUES (1, ?, ?)
				ON DUPLICATE KEY UPDATE schema_version = VALUES(schema_version), migrated_at = UTC_TIMESTAMP(6)`,
				inbox.SchemaVersion, string(s.layout)); err != nil {
				return fmt.Errorf("while recording the schema version: %w", err)
			}
			st.HasMeta, st.HasInbox, st.Version, st.Layout = true, true, inbox.SchemaVersion, string(s.layout)
		}
		if !st.IdentityDone(c) {
			if err := s.writeIdentity(ctx, conn, &st, c); err != nil {
				return err
			}
		}
		id.Owner, id.Epoch = st.Owner, st.Epoch
		return nil
	})
	if err != nil {
		return id, fmt.Errorf("while migrating inbox %s: %w", s.name(), err)
	}
	return id, nil
}

// writeIdentity mints the epoch (marker row first, then the meta row: a
// crash between leaves a marker no meta row names, which the next pass
// replaces) and records c's owner.
func (s *Inbox) writeIdentity(ctx context.Context, conn *sql.Conn, st *inbox.State, c *inbox.OwnerClaim) error {
	if st.NeedsEpoch(c) {
		epoch := inbox.NewEpoch()
		if _, err := conn.ExecContext(ctx, `DELETE FROM `+s.inbox+` WHERE message_id LIKE CONCAT(CHAR(0), 'idc-epoch:%')`); err != nil {
			return fmt.Errorf("while replacing the epoch marker: %w", err)
		}
		if _, err := conn.ExecContext(ctx, s.markerInsert(), []byte(epochMarker(epoch)), markerTime); err != nil {
			return fmt.Errorf("while writing the epoch marker: %w", err)
		}
		if _, err := conn.ExecContext(ctx, `UPDATE `+s.meta+` SET epoch = ?`, epoch); err != nil {
			return fmt.Errorf("while recording the inbox epoch: %w", err)
		}
		st.Epoch = epoch
	}
	if c != nil && st.Owner != c.Owner {
		if _, err := conn.ExecContext(ctx, `UPDATE `+s.meta+` SET owner_cluster = ?, owner_namespace = ?, owner_name = ?, owner_uid = ?`,
			c.Owner.Cluster, c.Owner.Namespace, c.Owner.Name, c.Owner.UID); err != nil {
			return fmt.Errorf("while recording the inbox owner: %w", err)
		}
		st.Owner = c.Owner
	}
	return nil
}

// withLock runs fn on one connection holding this inbox's GET_LOCK. The
// lock is the session's: it ends with the connection, so a migrator that
// dies never leaves it held.
func (s *Inbox) withLock(ctx context.Context, fn func(*sql.Conn) error) error {
	conn, err := s.d.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, ?)`, s.lockName, migrateLockTimeout).Scan(&got); err != nil {
		return fmt.Errorf("while taking the inbox DDL lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("while taking the inbox DDL lock: another migration held %s for %ds", s.lockName, migrateLockTimeout)
	}
	defer func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), `DO RELEASE_LOCK(?)`, s.lockName)
	}()
	return fn(conn)
}

type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// readState reads which tables exist (information_schema) and the meta
// row; an epoch whose marker row is gone reads as truncated.
func (s *Inbox) readState(ctx context.Context, q queryer) (inbox.State, error) {
	var st inbox.State
	rows, err := q.QueryContext(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = ? AND table_name IN (?, ?)`, s.names.Schema, s.names.Inbox, s.names.Meta)
	if err != nil {
		return st, fmt.Errorf("while looking for the inbox tables: %w", err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return st, err
		}
		st.HasInbox = st.HasInbox || t == s.names.Inbox
		st.HasMeta = st.HasMeta || t == s.names.Meta
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("while looking for the inbox tables: %w", err)
	}
	if !st.HasMeta {
		return st, nil
	}
	var epoch, cluster, ns, name, uid sql.NullString
	err = q.QueryRowContext(ctx, `SELECT schema_version, layout, epoch, owner_cluster, owner_namespace, owner_name, owner_uid FROM `+s.meta).
		Scan(&st.Version, &st.Layout, &epoch, &cluster, &ns, &name, &uid)
	if errors.Is(err, sql.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("while reading the inbox meta row: %w", err)
	}
	st.Epoch, st.Owner = epoch.String, inbox.Owner{Cluster: cluster.String, Namespace: ns.String, Name: name.String, UID: uid.String}
	if st.Epoch != "" && st.HasInbox {
		var n int
		if err := q.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+s.inbox+` WHERE message_id = ?`, []byte(epochMarker(st.Epoch))).Scan(&n); err != nil {
			return st, fmt.Errorf("while reading the epoch marker: %w", err)
		}
		if n == 0 {
			st.Epoch = inbox.TruncatedEpoch(st.Epoch)
		}
	}
	return st, nil
}

// Verify is the runtime's check that the inbox still holds the epoch it
// started with (a *inbox.LostError when not).
func (s *Inbox) Verify(ctx context.Context) (err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	if s.opts.Epoch == "" {
		return nil
	}
	st, err := s.readState(ctx, s.d.db)
	if err != nil {
		return err
	}
	if what := st.Lost(s.opts.Epoch); what != "" {
		return &inbox.LostError{Inbox: s.name(), Epoch: s.opts.Epoch, What: what}
	}
	return nil
}

// SchemaVersion is the recorded version, 0 when not migrated.
func (s *Inbox) SchemaVersion(ctx context.Context) (int, error) {
	st, err := s.readState(ctx, s.d.db)
	return st.Version, err
}

// Drop removes the inbox's tables when its meta row marks them as the
// operator's (inbox.ErrNotOperatorInbox otherwise); the meta table last, so
// a crash mid-drop leaves an inbox the next Drop still recognises.
func (s *Inbox) Drop(ctx context.Context) error { return s.drop(ctx, nil) }

// drop is Drop; with owner set, only when the meta row (read again under
// the lock) records owner.
func (s *Inbox) drop(ctx context.Context, owner *inbox.Owner) error {
	return s.withLock(ctx, func(conn *sql.Conn) error {
		st, err := s.readState(ctx, conn)
		if err != nil {
			return err
		}
		if !st.HasMeta {
			if st.HasInbox {
				return fmt.Errorf("while dropping inbox %s: %w: the meta table %s does not exist", s.name(), inbox.ErrNotOperatorInbox, s.names.Meta)
			}
			return nil
		}
		known := st.Layout == string(config.LayoutTable) || st.Layout == string(config.LayoutPartitioned)
		if st.Version < 1 || st.Version > inbox.SchemaVersion || !known {
			return fmt.Errorf("while dropping inbox %s: %w: meta row layout %q, schema version %d", s.name(), inbox.ErrNotOperatorInbox, st.Layout, st.Version)
		}
		if owner != nil && st.Owner != *owner {
			return fmt.Errorf("while dropping inbox %s: %w: it belongs to %s", s.name(), inbox.ErrNotOwner, st.Owner)
		}
		for _, t := range append(append([]string{s.inbox, s.claimLocks, s.deadLetters, s.pruneRuns, s.idConflicts, s.progress, s.window},
			s.optionalTables()...), s.meta) {
			if _, err := conn.ExecContext(ctx, `DROP TABLE IF EXISTS `+t); err != nil {
				return fmt.Errorf("while dropping inbox %s: %w", s.name(), err)
			}
		}
		return nil
	})
}
