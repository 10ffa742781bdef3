package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// IdentityTable holds the identity the controller mints once per database
// (PhysicalDatabase): one row, never changed.
const IdentityTable = "idc_database_identity"

// PhysicalDatabase names the database that holds the inbox s names, from
// the database itself, never from the connection string: two resources
// whose Secrets reach one database by different addresses or accounts get
// the same name ("<uuid>/<database>"), as PostgreSQL's system identifier
// and current_database() give them there.
//
// What identifies it is a row the controller mints once in a table of its
// own in that database (IdentityTable: a UUID() written with INSERT IGNORE
// on a one-row key, so concurrent first reads agree). The server offers
// nothing that would do:
//
//   - MySQL 8's @@server_uuid is per server installation: a replica has its
//     own, so a failover renames every database, and MariaDB has none.
//   - MariaDB's @@server_uid is a hash of the MAC address, the port and the
//     data directory: a pod restarted with a new address gets a new one.
//   - @@server_id is a configuration value, 1 on every server that does not
//     replicate; @@hostname and @@port are the pod's and repeat across
//     namespaces and clusters.
//
// The row is data: it replicates with the database (a promoted replica
// keeps the name), survives restarts and moves, and a logical copy of the
// database carries it, as a physical copy of a PostgreSQL cluster carries
// its system identifier. It costs the controller CREATE and INSERT on the
// database once, which its grants include (ControllerGrants); an account
// that may not read or mint it gets "unknown/<database>", as a PostgreSQL
// role that may not call pg_control_system() does. The name is cached per
// database for the DB's life.
func (d *DB) PhysicalDatabase(ctx context.Context, s config.Sink) (string, error) {
	database := s.Schema
	if err := ValidIdentifier(database); err != nil {
		return "", fmt.Errorf("while naming the physical database: %w", err)
	}
	d.idMu.Lock()
	defer d.idMu.Unlock()
	if id, ok := d.ids[database]; ok {
		return id, nil
	}
	id, err := d.databaseIdentity(ctx, database)
	if isPrivilege(err) {
		return "unknown/" + database, nil
	}
	if err != nil {
		return "", err
	}
	if d.ids == nil {
		d.ids = map[string]string{}
	}
	d.ids[database] = id + "/" + database
	return d.ids[database], nil
}

// databaseIdentity reads the database's identity row, minting it (and its
// table) the first time.
func (d *DB) databaseIdentity(ctx context.Context, database string) (string, error) {
	table := qualify(database, IdentityTable)
	read := func() (string, error) {
		var id string
		err := d.db.QueryRowContext(ctx, `SELECT uuid FROM `+table+` WHERE id = 1`).Scan(&id)
		return id, err
	}
	id, err := read()
	var me *mysql.MySQLError
	switch {
	case err == nil:
		return id, nil
	case errors.Is(err, sql.ErrNoRows), errors.As(err, &me) && me.Number == 1146:
	default:
		return "", fmt.Errorf("while reading the identity of database %s: %w", database, err)
	}
	if _, err := d.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (
			id        TINYINT UNSIGNED NOT NULL PRIMARY KEY,
			uuid      CHAR(36) CHARACTER SET ascii NOT NULL,
			minted_at DATETIME(6) NOT NULL
		) ENGINE = InnoDB`); err != nil {
		return "", fmt.Errorf("while creating the identity table of database %s: %w", database, err)
	}
	// IGNORE absorbs only the duplicate key of a concurrent mint: every
	// value is fixed or generated to fit.
	if _, err := d.db.ExecContext(ctx, `INSERT IGNORE INTO `+table+` (id, uuid, minted_at) VALUES (1, UUID(), UTC_TIMESTAMP(6))`); err != nil {
		return "", fmt.Errorf("while minting the identity of database %s: %w", database, err)
	}
	if id, err = read(); err != nil {
		return "", fmt.Errorf("while reading the identity of database %s: %w", database, err)
	}
	return id, nil
}

// isPrivilege says whether err is a privilege refusal (1142, 1143, 1044,
// 1227).
func isPrivilege(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1142, 1143, 1044, 1227:
		return true
	}
	return false
}
