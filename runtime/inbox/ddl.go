package inbox

import (
	"fmt"
	"strings"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// The DDL of an inbox's tables: what Migrate creates (ddl and the optional
// tables' statements) and how it upgrades tables of an older schema version.

func (s *Store) ddl() []string {
	n := s.names
	var stmts []string
	if s.layout == config.LayoutPartitioned {
		// published_on comes from the broker's stored publish time, stable
		// across redeliveries, so a message always maps to one partition.
		stmts = append(stmts, `CREATE TABLE IF NOT EXISTS `+s.inbox+` (
			message_id   text COLLATE "C" NOT NULL,
			published_on date NOT NULL,
			processed_at timestamptz NOT NULL DEFAULT now(),
			fingerprint  bigint,
			PRIMARY KEY (message_id, published_on)
		) PARTITION BY RANGE (published_on)`)
	} else {
		stmts = append(stmts, `CREATE TABLE IF NOT EXISTS `+s.inbox+` (
			message_id   text COLLATE "C" PRIMARY KEY,
			processed_at timestamptz NOT NULL DEFAULT now(),
			fingerprint  bigint
		)`)
	}
	return append(stmts,
		`CREATE TABLE IF NOT EXISTS `+s.idConflicts+` (
			id                   bigserial PRIMARY KEY,
			message_id           text NOT NULL,
			native_id            text,
			claimed_fingerprint  bigint NOT NULL,
			conflict_fingerprint bigint NOT NULL,
			payload              bytea,
			detected_at          timestamptz NOT NULL DEFAULT now()
		)`,
		// The index serves batched pruning (Table) and the oldest-row gauge.
		`CREATE INDEX IF NOT EXISTS `+ident(DerivedName(n.Inbox, "_processed_at_idx"))+
			` ON `+s.inbox+` (processed_at)`,
		`CREATE TABLE IF NOT EXISTS `+s.deadLetters+` (
			id           bigserial PRIMARY KEY,
			message_id   text NULL,
			native_id    text,
			reason       text NOT NULL,
			payload      bytea,
			headers      jsonb,
			attempts     int,
			published_at timestamptz,
			dead_at      timestamptz NOT NULL DEFAULT now(),
			reason_class text,
			CONSTRAINT `+ident(DerivedName(n.DeadLetters, "_native_id_key"))+` UNIQUE (native_id)
		)`,
		`CREATE TABLE IF NOT EXISTS `+s.pruneRuns+` (
			id                 bigserial PRIMARY KEY,
			started_at         timestamptz NOT NULL DEFAULT now(),
			finished_at        timestamptz,
			cutoff             timestamptz NOT NULL,
			rows_deleted       bigint NOT NULL DEFAULT 0,
			partitions_dropped int NOT NULL DEFAULT 0,
			window_seconds     bigint NOT NULL,
			error              text,
			window_cutoff      timestamptz,
			held_reason        text,
			held_since         timestamptz
		)`,
		// Schema version 5: one row per runtime process (replica), written
		// every few seconds, never per batch: when it last heartbeat, since
		// when its oldest claim is committed but not yet acknowledged, and
		// the highest broker positions it claimed. stale_since and
		// settle_mark are the prune job's: when it found the replica gone
		// and where the broker's delivery stood then (DESIGN.md section 9).
		`CREATE TABLE IF NOT EXISTS `+s.progress+` (
			replica        text PRIMARY KEY,
			started_at     timestamptz NOT NULL DEFAULT now(),
			heartbeat_at   timestamptz NOT NULL DEFAULT now(),
			last_commit_at timestamptz,
			unacked_since  timestamptz,
			positions      jsonb NOT NULL DEFAULT '{}',
			stopped        boolean NOT NULL DEFAULT false,
			stale_since    timestamptz,
			settle_mark    jsonb,
			consumer       jsonb
		)`,
		// The window in force and a pending shrink, beside the data: the
		// controller and the prune job adopt through one function, and a
		// resource re-created without status finds them here.
		`CREATE TABLE IF NOT EXISTS `+s.window+` (
			singleton          boolean PRIMARY KEY DEFAULT true CHECK (singleton),
			window_ms          bigint NOT NULL,
			inputs_hash        text NOT NULL,
			source             text NOT NULL,
			derived_from       text NOT NULL,
			redelivery_horizon text NOT NULL DEFAULT '',
			replay_horizon     text NOT NULL DEFAULT '',
			adopted_at         timestamptz NOT NULL,
			pending_window_ms  bigint,
			pending_since      timestamptz,
			updated_at         timestamptz NOT NULL DEFAULT now()
		)`,
	)
}

// upgradeDDL adds the columns later schema versions gave tables that an
// inbox older than version 5 created without them; ddl creates them with
// every column. Nullable columns, or a constant default: catalog changes
// only, no rewrite.
func (s *Store) upgradeDDL() []string {
	return []string{
		// Version 2: the payload fingerprint, NULL for ids claimed before
		// (they never count as conflicts).
		`ALTER TABLE ` + s.inbox + ` ADD COLUMN IF NOT EXISTS fingerprint bigint`,
		// reason_class is the bounded class of the reason (the metric's
		// label), which redrive --reason selects on; rows written before
		// it existed have NULL there.
		`ALTER TABLE ` + s.deadLetters + ` ADD COLUMN IF NOT EXISTS reason_class text`,
		// window_cutoff is now() - window; cutoff is lower when the
		// consumer's progress held pruning back, held_reason says why.
		`ALTER TABLE ` + s.pruneRuns + ` ADD COLUMN IF NOT EXISTS window_cutoff timestamptz,
			ADD COLUMN IF NOT EXISTS held_reason text,
			ADD COLUMN IF NOT EXISTS held_since timestamptz`,
	}
}

// progressUpgradeDDL adds <inbox>_progress.consumer (schema version 7): the
// broker consumer the replica consumed from (ConsumerIdentity), which a
// prune run needs before it may take a broker reading as evidence about a
// gone replica's claims. It is nullable (rows of older runtimes have none)
// and added only when missing, so an inbox that has it takes no lock.
func (s *Store) progressUpgradeDDL() []string {
	return []string{`DO $idc$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = ` + literal(s.progress) + `::regclass
				AND attname = 'consumer' AND NOT attisdropped) THEN
			ALTER TABLE ` + s.progress + ` ADD COLUMN consumer jsonb;
		END IF;
	END $idc$`}
}

// outboxDDL creates the transactional outbox (spec.emit, http delivery:
// Outbox) at its current shape. shard is a hash of the entity key (else the
// message id): one relay at a time publishes a shard, in id order, which
// keeps per-key order.
func (s *Store) outboxDDL() []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + s.outbox + ` (
			id         bigserial PRIMARY KEY,
			event_id   text NOT NULL UNIQUE,
			source_id  text NOT NULL,
			shard      smallint NOT NULL,
			payload    bytea NOT NULL,
			created_at timestamptz NOT NULL DEFAULT now(),
			sent_at    timestamptz,
			headers    jsonb,
			order_key  text,
			attempts   int NOT NULL DEFAULT 0,
			last_error text
		)`,
		`CREATE INDEX IF NOT EXISTS ` + ident(DerivedName(s.names.Outbox, "_unsent_idx")) +
			` ON ` + s.outbox + ` (shard, id) WHERE sent_at IS NULL`,
	}
}

// outboxUpgradeDDL adds what schema version 4 gave the outbox: per-event
// headers (emit.headers), the ordering key the http dispatcher groups calls
// by, and the attempts and last error of an event that keeps failing.
func (s *Store) outboxUpgradeDDL() []string {
	return []string{`ALTER TABLE ` + s.outbox + ` ADD COLUMN IF NOT EXISTS headers jsonb,
			ADD COLUMN IF NOT EXISTS order_key text,
			ADD COLUMN IF NOT EXISTS attempts int NOT NULL DEFAULT 0,
			ADD COLUMN IF NOT EXISTS last_error text`}
}

// redrivesDDL creates the log of redrive outcomes, which the first redrive
// run of an inbox creates.
func (s *Store) redrivesDDL() []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + s.redrives + ` (
			id             bigserial PRIMARY KEY,
			run            text NOT NULL,
			redriven_at    timestamptz NOT NULL DEFAULT now(),
			dead_letter_id bigint NOT NULL,
			message_id     text,
			outcome        text NOT NULL,
			reason         text
		)`,
		`CREATE INDEX IF NOT EXISTS ` + ident(DerivedName(s.names.Redrives, "_run_idx")) + ` ON ` + s.redrives + ` (run)`,
	}
}

// metaDDL creates the table that records the schema version and layout,
// after every other table.
func (s *Store) metaDDL() string {
	return `CREATE TABLE IF NOT EXISTS ` + s.meta + ` (
			singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
			schema_version int NOT NULL,
			layout         text NOT NULL,
			migrated_at    timestamptz NOT NULL DEFAULT now(),
			owner_cluster   text,
			owner_namespace text,
			owner_name      text,
			owner_uid       text,
			epoch           text
		)`
}

// metaUpgradeDDL gives a meta table of schema version 6 or older what 7
// added: the owner and the epoch (nullable: a catalog change on a
// one-row table that no claim reads).
func (s *Store) metaUpgradeDDL() string {
	return `ALTER TABLE ` + s.meta + ` ADD COLUMN IF NOT EXISTS owner_cluster text,
			ADD COLUMN IF NOT EXISTS owner_namespace text, ADD COLUMN IF NOT EXISTS owner_name text,
			ADD COLUMN IF NOT EXISTS owner_uid text, ADD COLUMN IF NOT EXISTS epoch text`
}

// insertVersion records the version and layout of a new inbox.
func (s *Store) insertVersion() string {
	return fmt.Sprintf(`INSERT INTO %s (schema_version, layout) VALUES (%d, %s)`, s.meta, SchemaVersion, literal(string(s.layout)))
}

// literal quotes s as an SQL string literal (standard_conforming_strings,
// on since PostgreSQL 9.1: only the quote is special).
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
