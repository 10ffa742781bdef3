package sinkdb

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	driver "github.com/go-sql-driver/mysql"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/errtext"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
)

// mysqlErrorNumber is err's MySQL/MariaDB error number, 0 for none.
func mysqlErrorNumber(err error) uint16 {
	var me *driver.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// dbDeniedRE reads 1044's "Access denied for user 'u'@'h' to database 'd'".
var dbDeniedRE = regexp.MustCompile(`^Access denied for user '((?:[^']|'')*)'@'([^']*)' to database '([^']+)'`)

// classifyMySQL is Classify for a MySQL/MariaDB server error: the error
// numbers map onto the reasons PostgreSQL's SQLSTATEs map onto. ok is false
// for an error that is not one (a connection refused or a timeout is then
// DatabaseUnreachable, as on PostgreSQL). The server's messages name the
// account at most, never the password or the connection string.
func classifyMySQL(err error, ref messagingv1alpha1.SecretKeyRef, where string) (reason, msg string, ok bool) {
	var me *driver.MySQLError
	if !errors.As(err, &me) {
		return "", "", false
	}
	text := errtext.Sanitize(me.Message)
	code := fmt.Sprintf("MySQL error %d", me.Number)
	switch me.Number {
	case 1045:
		// Access denied (authentication): a wrong password or no such
		// account for this host; no grant helps.
		return messagingv1alpha1.ReasonAuthenticationFailed, fmt.Sprintf("the sink database refused the credentials in Secret %q key %q (%s: %s): check the user and password in the connection string (and the host the account is created for)",
			ref.Name, ref.Key, code, text), true
	case 1044, 1142, 1143, 1227:
		return messagingv1alpha1.ReasonPermissionDenied, fmt.Sprintf("permission denied on %s (%s: %s); %s", where, code, text, mysqlGrantAdvice(err)), true
	case 1049:
		return messagingv1alpha1.ReasonDatabaseError, fmt.Sprintf("%s does not exist (%s: %s); create the database (CREATE DATABASE) or fix the connection string and spec.sink.mysql.database", where, code, text), true
	case 1146:
		return messagingv1alpha1.ReasonTableNotFound, fmt.Sprintf("a table is missing in %s (%s: %s)", where, code, text), true
	case 1054:
		return messagingv1alpha1.ReasonColumnNotFound, fmt.Sprintf("a column is missing in %s (%s: %s)", where, code, text), true
	case 1040, 1053, 1205, 1213, 1927:
		// Too many connections, a shutdown, a lock wait or deadlock, a
		// killed connection: transient.
		return messagingv1alpha1.ReasonDatabaseError, fmt.Sprintf("%s is busy or going away (%s: %s); retrying with backoff", where, code, text), true
	}
	return messagingv1alpha1.ReasonProvisioningFailed, fmt.Sprintf("provisioning the inbox in %s failed (%s: %s)", where, code, text), true
}

// mysqlGrantAdvice says what to run for a privilege error: the GRANT the
// error carries (mysql.PrivilegeError, named for the account the server
// matched), else for 1044 the controller's grant on the database it names.
func mysqlGrantAdvice(err error) string {
	var pe *mysql.PrivilegeError
	if errors.As(err, &pe) {
		return "run " + pe.Grant
	}
	var me *driver.MySQLError
	if errors.As(err, &me) && me.Number == 1044 {
		if m := dbDeniedRE.FindStringSubmatch(me.Message); m != nil {
			return "run " + mysql.ControllerGrants(m[3], strings.ReplaceAll(m[1], "''", "'")+"@"+m[2])[0]
		}
	}
	return "GRANT the account the privilege the message names (the controller's account: SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, DROP, INDEX, LOCK TABLES on the database)"
}
