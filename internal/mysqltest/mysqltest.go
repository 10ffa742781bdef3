// Package mysqltest gives each test its own database on the real MySQL or
// MariaDB server (the machine's MariaDB on 127.0.0.1:3306), so tests never
// share state and never touch other databases: the MySQL counterpart of
// internal/pgtest.
package mysqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// AdminDSNEnv overrides the maintenance connection (default: root with an
// empty password on 127.0.0.1:3306, no database).
const AdminDSNEnv = "IDC_TEST_MYSQL_DSN"

const defaultAdminDSN = "root@tcp(127.0.0.1:3306)/"

// DatabasePrefix starts the name of every database these helpers create.
const DatabasePrefix = "idc_test"

// AdminDSN is the maintenance connection: IDC_TEST_MYSQL_DSN, else the
// loopback server as root.
func AdminDSN() string {
	if v := os.Getenv(AdminDSNEnv); v != "" {
		return v
	}
	return defaultAdminDSN
}

// NewDatabase creates an empty database named idc_test_<random> and returns
// its name and a DSN for it (go-sql-driver/mysql format). It is dropped when
// the test ends. An unreachable server fails the test: these tests never
// skip.
func NewDatabase(t testing.TB) (name, dsn string) {
	t.Helper()
	cfg, err := mysql.ParseDSN(AdminDSN())
	if err != nil {
		t.Fatalf("mysqltest: while parsing the admin DSN: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("mysqltest: %v", err)
	}
	defer func() { _ = admin.Close() }()
	if err := admin.PingContext(ctx); err != nil {
		t.Fatalf("mysqltest: MySQL/MariaDB is required for this test and is unreachable: %v", err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name = DatabasePrefix + "_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatalf("mysqltest: while creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Errorf("mysqltest: %v", err)
			return
		}
		defer func() { _ = admin.Close() }()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Errorf("mysqltest: while dropping database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	return name, cfg.FormatDSN()
}
