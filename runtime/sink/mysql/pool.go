package mysql

import (
	"github.com/go-sql-driver/mysql"
)

// ParseDSN checks that dsn is a go-sql-driver/mysql DSN
// (user:password@tcp(host:3306)/database?param=value). Its error may quote
// parts of the DSN: callers must not log it.
func ParseDSN(dsn string) (*mysql.Config, error) { return mysql.ParseDSN(dsn) }

// SetMaxConns sizes the pool: at most n open connections, all of them kept
// idle between batches (a new connection costs a handshake and the session
// setup), as the PostgreSQL pool keeps its MaxConns.
func (d *DB) SetMaxConns(n int) {
	d.db.SetMaxOpenConns(n)
	d.db.SetMaxIdleConns(n)
}
