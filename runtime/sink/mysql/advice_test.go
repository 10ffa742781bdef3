package mysql_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	driver "github.com/go-sql-driver/mysql"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
)

// TestAdvice: the GRANT named for each privilege error the servers word
// (MariaDB 10.11 qualifies the table, MySQL 8 may not; the user@host in
// the message is the client's, the account CURRENT_USER()'s).
func TestAdvice(t *testing.T) {
	for _, c := range []struct {
		number uint16
		msg    string
		want   string
	}{
		{1142, "INSERT command denied to user 'idc'@'10.0.0.7' for table `app`.`orders_inbox`",
			"GRANT INSERT ON `app`.`orders_inbox` TO 'idc'@'%'"},
		{1142, "INSERT, UPDATE command denied to user 'idc'@'10.0.0.7' for table `app`.`orders_inbox`",
			"GRANT INSERT, UPDATE ON `app`.`orders_inbox` TO 'idc'@'%'"},
		{1142, "DELETE command denied to user 'idc'@'localhost' for table 'orders_inbox'",
			"GRANT DELETE ON `fallback`.`orders_inbox` TO 'idc'@'%'"},
		{1143, "SELECT command denied to user 'idc'@'localhost' for column 'seq' in table 'orders'",
			"GRANT SELECT (`seq`) ON `fallback`.`orders` TO 'idc'@'%'"},
		{1044, "Access denied for user 'idc'@'%' to database 'app'", ""},
		{1227, "Access denied; you need (at least one of) the SUPER privilege(s) for this operation", ""},
		{1146, "Table 'app.x' doesn't exist", ""},
	} {
		err := fmt.Errorf("while claiming: %w", &driver.MySQLError{Number: c.number, Message: c.msg})
		if got := mysql.Advice(err, "fallback", "idc@%"); got != c.want {
			t.Errorf("Advice(%d %q) = %q, want %q", c.number, c.msg, got, c.want)
		}
		if class, reason := mysql.Classify(err); (c.number == 1142 || c.number == 1143 || c.number == 1044 || c.number == 1227) &&
			(class != sink.ClassSink || reason != sink.ReasonInsufficientPrivilege) {
			t.Errorf("Classify(%d) = %d, %q", c.number, class, reason)
		}
	}
	if got := mysql.Advice(errors.New("INSERT command denied to user 'a'@'b' for table `x`.`y`"), "d", "a@%"); got != "" {
		t.Errorf("Advice of a non-server error = %q", got)
	}
	// The account is quoted as SQL: a quote inside doubled.
	err := &driver.MySQLError{Number: 1142, Message: "SELECT command denied to user 'o''b'@'h' for table `d`.`t`"}
	if got := mysql.Advice(err, "", "o'b@10.%"); got != "GRANT SELECT ON `d`.`t` TO 'o''b'@'10.%'" {
		t.Errorf("Advice with a quote in the user = %q", got)
	}
	// A PrivilegeError keeps the server error for Classify and shows the GRANT.
	pe := &mysql.PrivilegeError{Err: err, Grant: "GRANT SELECT ON `d`.`t` TO 'x'@'%'"}
	if class, reason := mysql.Classify(fmt.Errorf("wrapped: %w", pe)); class != sink.ClassSink || reason != sink.ReasonInsufficientPrivilege {
		t.Errorf("Classify(PrivilegeError) = %d, %q", class, reason)
	}
	if !strings.Contains(pe.Error(), pe.Grant) || !strings.Contains(pe.Error(), "command denied") {
		t.Errorf("PrivilegeError = %q", pe.Error())
	}
}

// TestRuntimeGrants: the documented grants name every table the runtime
// touches, in each layout, and give the partition DDL only to Partitioned.
func TestRuntimeGrants(t *testing.T) {
	n := inbox.NamesForMax(config.Sink{Schema: "app", InboxTable: "orders_inbox"}, mysql.MaxIdentifier)
	table := strings.Join(mysql.RuntimeGrants(n, config.LayoutTable, "rt@%"), "\n")
	parts := strings.Join(mysql.RuntimeGrants(n, config.LayoutPartitioned, "rt@%"), "\n")
	for _, tb := range []string{n.Inbox, n.DeadLetters, n.PruneRuns, n.IDConflicts, n.Progress, n.Window, n.Meta} {
		if !strings.Contains(table, "`app`.`"+tb+"` TO 'rt'@'%'") || !strings.Contains(parts, "`app`.`"+tb+"`") {
			t.Errorf("no grant on %s:\n%s", tb, table)
		}
	}
	if strings.Contains(table, "ALTER") || strings.Contains(table, "LOCK TABLES") {
		t.Errorf("Table layout grants DDL:\n%s", table)
	}
	if !strings.Contains(parts, "GRANT LOCK TABLES ON `app`.* TO 'rt'@'%'") || !strings.Contains(parts, "ALTER, DROP ON `app`.`orders_inbox`") {
		t.Errorf("Partitioned grants lack the partition DDL:\n%s", parts)
	}
	// The optional tables only for an inbox that uses them.
	if strings.Contains(table, "_outbox") || strings.Contains(table, n.Redrives) {
		t.Errorf("grants without options name an optional table:\n%s", table)
	}
	all := mysql.RuntimeGrants(n, config.LayoutTable, "rt@%", inbox.WithOutbox(true), inbox.WithRedrives())
	for _, want := range []string{
		"GRANT SELECT, INSERT, UPDATE, DELETE ON `app`.`orders_inbox_outbox` TO 'rt'@'%'",
		"GRANT SELECT, UPDATE ON `app`.`orders_inbox_outbox_shards` TO 'rt'@'%'",
		"GRANT SELECT, INSERT ON `app`.`orders_inbox_redrives` TO 'rt'@'%'",
	} {
		if !slices.Contains(all, want) {
			t.Errorf("grants with the outbox and the redrives log lack %s:\n%s", want, strings.Join(all, "\n"))
		}
	}
	if got := mysql.RuntimeGrants(n, config.LayoutTable, "rt@%", inbox.WithOutbox(true)); slices.ContainsFunc(got, func(g string) bool { return strings.Contains(g, n.Redrives) }) {
		t.Errorf("grants with the outbox alone name the redrives log:\n%s", strings.Join(got, "\n"))
	}
}
