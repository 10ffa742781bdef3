// Package mysql is the MySQL/MariaDB dialect of the sink seam
// (runtime/sink, whose package comment is the design): database/sql with
// github.com/go-sql-driver/mysql, InnoDB tables, READ COMMITTED sessions.
//
// Every connection is set up once when it is made: READ COMMITTED (no gap
// locks between concurrent claims), a strict sql_mode (a value that does
// not fit is an error, never a silent truncation) and time_zone UTC (every
// DATETIME(6) is UTC, written from UTC_TIMESTAMP(6), the database clock).
// Parameters are interpolated by the driver (interpolateParams), so a
// statement with arguments is one round trip, not a prepare and an execute.
package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// MaxIdentifier is MySQL's identifier length (characters).
const MaxIdentifier = 64

// maxIDBytes is the width of the message_id column (VARBINARY): the
// consumer's own bound on ids (1024 bytes), well under InnoDB's 3072-byte
// key prefix limit.
const maxIDBytes = 1024

// sessionSQL runs on every new connection.
var sessionSQL = []string{
	"SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
	"SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION', time_zone = '+00:00'",
}

// ClaimStrategy is how Claim tells new ids from duplicates.
type ClaimStrategy int

const (
	// ClaimAuto picks ClaimReturning on MariaDB 10.5+, ClaimCount elsewhere.
	ClaimAuto ClaimStrategy = iota
	// ClaimReturning: INSERT IGNORE … RETURNING (MariaDB 10.5+), one round
	// trip.
	ClaimReturning
	// ClaimCount: read the existing ids, insert the rest, check the
	// affected-rows count (MySQL 8, which has no RETURNING); two round trips.
	ClaimCount
)

// DB is a MySQL or MariaDB sink database.
type DB struct {
	db       *sql.DB
	claim    ClaimStrategy
	version  string
	skipLock bool   // FOR UPDATE SKIP LOCKED (MySQL 8.0+, MariaDB 10.6+)
	account  string // CURRENT_USER(), for the GRANT a privilege error names (advice.go)

	idMu sync.Mutex
	ids  map[string]string // PhysicalDatabase by database (physical.go)
}

var _ sink.DB = (*DB)(nil)

// Option configures Open.
type Option func(*DB)

// WithClaimStrategy forces a claim strategy (the conformance suite runs
// ClaimCount on MariaDB too).
func WithClaimStrategy(c ClaimStrategy) Option { return func(d *DB) { d.claim = c } }

// Open connects to dsn (go-sql-driver/mysql format) and reads the server's
// version, which picks the claim strategy.
func Open(ctx context.Context, dsn string, opts ...Option) (*DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("while parsing the MySQL DSN: %w", err)
	}
	cfg.ParseTime, cfg.Loc, cfg.InterpolateParams = true, time.UTC, true
	// The claim and the upsert read the affected-rows count: an existing
	// row left unchanged must count 0, whatever the DSN asked for.
	cfg.ClientFoundRows = false
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("while configuring the MySQL connection: %w", err)
	}
	d := &DB{db: sql.OpenDB(sessionConnector{conn})}
	for _, o := range opts {
		o(d)
	}
	if err := d.db.QueryRowContext(ctx, "SELECT VERSION(), CURRENT_USER()").Scan(&d.version, &d.account); err != nil {
		_ = d.db.Close()
		return nil, fmt.Errorf("while reading the server version: %w", err)
	}
	mariadb, major, minor := parseVersion(d.version)
	if d.claim == ClaimAuto {
		d.claim = ClaimCount
		if mariadb && (major > 10 || major == 10 && minor >= 5) {
			d.claim = ClaimReturning
		}
	}
	d.skipLock = mariadb && (major > 10 || major == 10 && minor >= 6) || !mariadb && major >= 8
	return d, nil
}

// parseVersion reads "10.11.19-MariaDB-0+deb12u1" or "8.0.36".
func parseVersion(v string) (mariadb bool, major, minor int) {
	mariadb = strings.Contains(strings.ToLower(v), "mariadb")
	parts := strings.SplitN(v, ".", 3)
	if len(parts) >= 2 {
		major, _ = strconv.Atoi(parts[0])
		minor, _ = strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	}
	return mariadb, major, minor
}

// sessionConnector sets every new connection up (sessionSQL).
type sessionConnector struct{ driver.Connector }

func (c sessionConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		_ = conn.Close()
		return nil, errors.New("the MySQL driver connection cannot execute statements")
	}
	for _, s := range sessionSQL {
		if _, err := ex.ExecContext(ctx, s, nil); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("while setting up the session (%s): %w", s, err)
		}
	}
	return conn, nil
}

// SQL is the pool (for tests and the controller's preflight).
func (d *DB) SQL() *sql.DB { return d.db }

// Version is the server's version string.
func (d *DB) Version() string { return d.version }

// Claim is the strategy in use.
func (d *DB) Claim() ClaimStrategy { return d.claim }

// Close closes the connections.
func (d *DB) Close() { _ = d.db.Close() }

func (*DB) Kind() sink.Kind { return sink.MySQL }

func (d *DB) Ping(ctx context.Context) error { return d.db.PingContext(ctx) }

// Tx is a claim transaction of this dialect.
type Tx struct{ *sql.Tx }

func (t Tx) Commit(context.Context) error   { return t.Tx.Commit() }
func (t Tx) Rollback(context.Context) error { return t.Tx.Rollback() }

// Begin is START TRANSACTION at the session's READ COMMITTED.
func (d *DB) Begin(ctx context.Context) (sink.Tx, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("while beginning: %w", err)
	}
	return Tx{tx}, nil
}

func sqlTx(tx sink.Tx) (*sql.Tx, error) {
	t, ok := tx.(Tx)
	if !ok {
		return nil, sink.ErrForeignTx
	}
	return t.Tx, nil
}

func (d *DB) Inbox(s config.Sink, opts ...inbox.Option) (sink.Inbox, error) {
	return NewInbox(d, s, opts...)
}

func (d *DB) Effect(cfg config.Effect, schema string, entity *config.Entity) (sink.Effect, error) {
	if err := ValidIdentifier(schema); err != nil {
		return nil, fmt.Errorf("while building the effect: database: %w", err)
	}
	switch {
	case cfg.Upsert != nil:
		return newUpsert(cfg.Upsert, schema, entity)
	case cfg.Append != nil:
		return newAppend(cfg.Append, schema)
	case cfg.SQL != nil:
		return newSQL(cfg.SQL)
	}
	return nil, fmt.Errorf("while building the effect: %w: only upsert, append and sql run on MySQL", sink.ErrUnsupported)
}

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,63}$`)

// ValidIdentifier checks a database, table or column name against the
// spec's rule at MySQL's length: lower case letters, digits and _, not
// starting with a digit, at most 64 characters.
func ValidIdentifier(name string) error {
	if !identRE.MatchString(name) {
		return fmt.Errorf("identifier %q must match %s (MySQL keeps %d characters)", name, identRE, MaxIdentifier)
	}
	return nil
}

// quote quotes a validated identifier with backticks (a backtick inside is
// doubled, though ValidIdentifier admits none).
func quote(name string) string { return "`" + strings.ReplaceAll(name, "`", "``") + "`" }

func qualify(db, table string) string { return quote(db) + "." + quote(table) }

// placeholders is "(?, ?, …)" repeated rows times, comma-separated.
func placeholders(rows, cols int) string {
	one := "(" + strings.TrimSuffix(strings.Repeat("?, ", cols), ", ") + ")"
	var b strings.Builder
	b.Grow(rows * (len(one) + 2))
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(one)
	}
	return b.String()
}

// Classify maps MySQL and MariaDB error numbers onto the seam's classes.
func (*DB) Classify(err error) (sink.Class, string) { return Classify(err) }

// Classify is DB.Classify without a DB.
func Classify(err error) (sink.Class, string) {
	if errors.Is(err, ErrClaimRace) {
		return sink.ClassUnavailable, ""
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		if r, ok := errorRules[me.Number]; ok {
			return r.class, r.reason
		}
		state := string(me.SQLState[:])
		if state == "40001" || strings.HasPrefix(state, "08") {
			return sink.ClassUnavailable, ""
		}
		if strings.HasPrefix(state, "22") || strings.HasPrefix(state, "23") {
			return sink.ClassData, ""
		}
		return sink.ClassMessages, ""
	}
	if errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		return sink.ClassUnavailable, ""
	}
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) {
		return sink.ClassUnavailable, ""
	}
	return sink.ClassMessages, ""
}

type errorRule struct {
	class  sink.Class
	reason string
}

// errorRules: the server error numbers the loop must not treat as a
// message's fault, with the reason of each ClassSink one.
var errorRules = map[uint16]errorRule{
	1213: {sink.ClassUnavailable, ""}, // ER_LOCK_DEADLOCK
	1205: {sink.ClassUnavailable, ""}, // ER_LOCK_WAIT_TIMEOUT
	1040: {sink.ClassUnavailable, ""}, // too many connections
	1053: {sink.ClassUnavailable, ""}, // server shutdown in progress
	1927: {sink.ClassUnavailable, ""}, // connection killed (MariaDB)
	1146: {sink.ClassSink, sink.ReasonUndefinedTable},
	1049: {sink.ClassSink, sink.ReasonUndefinedDatabase},
	1054: {sink.ClassSink, sink.ReasonUndefinedColumn},
	1142: {sink.ClassSink, sink.ReasonInsufficientPrivilege}, // table access denied
	1143: {sink.ClassSink, sink.ReasonInsufficientPrivilege}, // column access denied
	1044: {sink.ClassSink, sink.ReasonInsufficientPrivilege}, // database access denied
	1227: {sink.ClassSink, sink.ReasonInsufficientPrivilege}, // needs SUPER or the like
	1045: {sink.ClassSink, sink.ReasonAuthentication},
	1064: {sink.ClassSink, sink.ReasonInvalidStatement},
	1149: {sink.ClassSink, sink.ReasonInvalidStatement},
	1792: {sink.ClassSink, sink.ReasonReadOnly}, // read-only transaction
	1290: {sink.ClassSink, sink.ReasonReadOnly}, // --read-only
	1836: {sink.ClassSink, sink.ReasonReadOnly}, // read-only mode
	1264: {sink.ClassData, ""},                  // out of range
	1265: {sink.ClassData, ""},                  // data truncated
	1292: {sink.ClassData, ""},                  // incorrect datetime value
	1366: {sink.ClassData, ""},                  // incorrect value for column
	1406: {sink.ClassData, ""},                  // data too long
	1048: {sink.ClassData, ""},                  // column cannot be null
	1062: {sink.ClassData, ""},                  // duplicate key (another unique key than the upsert's)
	1452: {sink.ClassData, ""},                  // foreign key
	3140: {sink.ClassData, ""},                  // invalid JSON
}

// dbNow reads the database clock.
func dbNow(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (time.Time, error) {
	var t time.Time
	if err := q.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(6)").Scan(&t); err != nil {
		return t, fmt.Errorf("while reading the database clock: %w", err)
	}
	return t, nil
}
