package mysql

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// Privilege errors name what to GRANT. MySQL and MariaDB say which
// privilege a statement lacked on which table (1142) or column (1143):
//
//	INSERT command denied to user 'idc'@'10.0.0.7' for table `app`.`orders_inbox`
//	INSERT, UPDATE command denied to user 'idc'@'10.0.0.7' for table `app`.`orders_inbox`
//	SELECT command denied to user 'idc'@'10.0.0.7' for column 'seq' in table 'orders'
//
// The user there is the connection's USER() (the client's address), not
// the account the server matched; the DB reads CURRENT_USER() at open and
// Advice names that account, so the GRANT it prints is the one to run.
// 1044 (a database-level privilege, e.g. LOCK TABLES) and 1227 (SUPER and
// the like) do not name the privilege: the operation that knows it says so
// itself (PrunePartitions' LOCK TABLES), and Advice is "" for them.

var (
	tableDeniedRE  = regexp.MustCompile("^([A-Z][A-Z ,]*?) command denied to user '(?:[^']|'')*'@'[^']*' for table [`']([^`']+)[`'](?:\\.[`']([^`']+)[`'])?")
	columnDeniedRE = regexp.MustCompile("^([A-Z][A-Z ,]*?) command denied to user '(?:[^']|'')*'@'[^']*' for column [`']([^`']+)[`'] in table [`']([^`']+)[`']")
)

// Advice is the GRANT statement that gives account ("user@host", as
// CURRENT_USER() says it) what err lacked, "" when err is not a privilege
// error that names one. database fills in a message that names the table
// alone (MySQL 8).
func Advice(err error, database, account string) string {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return ""
	}
	var verbs, db, table, column string
	switch me.Number {
	case 1142:
		m := tableDeniedRE.FindStringSubmatch(me.Message)
		if m == nil {
			return ""
		}
		verbs, db, table = m[1], database, m[2]
		if m[3] != "" {
			db, table = m[2], m[3]
		}
	case 1143:
		m := columnDeniedRE.FindStringSubmatch(me.Message)
		if m == nil {
			return ""
		}
		verbs, column, db, table = m[1], m[2], database, m[3]
	default:
		return ""
	}
	if db == "" {
		return ""
	}
	if column != "" {
		var vs []string
		for _, v := range strings.Split(verbs, ",") {
			vs = append(vs, strings.TrimSpace(v)+" ("+quote(column)+")")
		}
		verbs = strings.Join(vs, ", ")
	}
	return fmt.Sprintf("GRANT %s ON %s TO %s", verbs, qualify(db, table), accountSQL(account))
}

// grantOn is the GRANT of a database-level privilege (LOCK TABLES).
func grantOn(privilege, database, account string) string {
	return fmt.Sprintf("GRANT %s ON %s.* TO %s", privilege, quote(database), accountSQL(account))
}

// accountSQL quotes "user@host" as 'user'@'host'.
func accountSQL(account string) string {
	user, host := userHost(account)
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	return q(user) + "@" + q(host)
}

// PrivilegeError is a privilege error with the GRANT that fixes it: its
// message is the server's and the statement to run; errors.As still finds
// the *mysql.MySQLError beneath (Classify: insufficient_privilege).
type PrivilegeError struct {
	Err   error
	Grant string
}

func (e *PrivilegeError) Error() string {
	return e.Err.Error() + " (to grant it, run: " + e.Grant + ")"
}
func (e *PrivilegeError) Unwrap() error { return e.Err }

// WithAdvice wraps a privilege error in a *PrivilegeError naming the GRANT
// for this DB's account; any other error is returned as it is.
func (d *DB) WithAdvice(err error, database string) error {
	var pe *PrivilegeError
	if err == nil || errors.As(err, &pe) {
		return err
	}
	if g := Advice(err, database, d.account); g != "" {
		return &PrivilegeError{Err: err, Grant: g}
	}
	return err
}

// Account is the account the server matched this DB's user to
// (CURRENT_USER(): "user@host").
func (d *DB) Account() string { return d.account }
