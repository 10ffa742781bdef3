package consumer

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
)

// The one table of how SQLSTATEs are treated, checked code by code.
func TestClassifySQLState(t *testing.T) {
	for _, tc := range []struct {
		code   string
		what   string
		kind   failureKind
		reason string
	}{
		{"42P01", "relation does not exist", failureSink, SinkUndefinedTable},
		{"3F000", "schema does not exist", failureSink, SinkUndefinedTable},
		{"42703", "column does not exist", failureSink, SinkUndefinedColumn},
		{"42P10", "no unique or exclusion constraint matching the ON CONFLICT specification", failureSink, SinkNoUniqueConstraint},
		{"42501", "permission denied for table", failureSink, SinkInsufficientPrivilege},
		{"42601", "syntax error; cannot insert multiple commands into a prepared statement", failureSink, SinkInvalidStatement},
		{"42804", "column is of type integer but expression is of type text", failureSink, SinkInvalidStatement},
		{"42P18", "could not determine data type of parameter", failureSink, SinkInvalidStatement},
		{"42883", "function does not exist", failureSink, SinkUndefinedObject},
		{"42704", "type does not exist", failureSink, SinkUndefinedObject},
		{"25006", "cannot execute INSERT in a read-only transaction", failureSink, SinkReadOnly},
		{"0A000", "feature not supported", failureSink, SinkInvalidStatement},
		{"28P01", "password authentication failed", failureSink, SinkAuthentication},
		{"28000", "role is not permitted to log in", failureSink, SinkAuthentication},
		{"3D000", "database does not exist", failureSink, SinkUndefinedDatabase},
		{"08006", "connection failure", failureUnavailable, ""},
		{"53100", "disk full", failureUnavailable, ""},
		{"53300", "too many connections", failureUnavailable, ""},
		{"57P01", "admin shutdown", failureUnavailable, ""},
		{"57P02", "crash shutdown", failureUnavailable, ""},
		{"57P03", "cannot connect now", failureUnavailable, ""},
		{"40001", "serialization failure", failureUnavailable, ""},
		{"40P01", "deadlock detected", failureUnavailable, ""},
		{"22P02", "invalid input syntax for type integer", failureData, ""},
		{"22003", "numeric value out of range", failureData, ""},
		{"22001", "value too long for type", failureData, ""},
		{"23502", "null value violates not-null constraint", failureData, ""},
		{"23514", "violates check constraint", failureData, ""},
		{"23505", "duplicate key value violates unique constraint", failureData, ""},
		{"23503", "violates foreign key constraint", failureData, ""},
		{"P0001", "raise_exception in a trigger", failureMessages, ""},
		{"57014", "canceling statement due to statement timeout", failureMessages, ""},
		{"XX000", "internal error", failureMessages, ""},
	} {
		t.Run(tc.code, func(t *testing.T) {
			wrapped := fmt.Errorf("while committing a batch of 3 records: %w",
				fmt.Errorf("while appending 3 rows: %w", &pgconn.PgError{Code: tc.code, Message: tc.what}))
			kind, reason := classifyWith(postgres.DB{}, wrapped)
			if kind != tc.kind || reason != tc.reason {
				t.Errorf("%s (%s): kind %d reason %q, want kind %d reason %q", tc.code, tc.what, kind, reason, tc.kind, tc.reason)
			}
			if tc.kind == failureSink {
				found := false
				for _, r := range SinkReasons {
					found = found || r == reason
				}
				if !found {
					t.Errorf("reason %q is not in SinkReasons, so the gauge never exports it", reason)
				}
			}
		})
	}
}

func TestClassifyNonDatabaseErrors(t *testing.T) {
	if kind, _ := classifyWith(postgres.DB{}, fmt.Errorf("while beginning: %w", pgconn.ErrConnClosed)); kind != failureUnavailable {
		t.Errorf("a closed connection is kind %d, want unavailable", kind)
	}
	if kind, _ := classifyWith(postgres.DB{}, errors.New("column n: value missing")); kind != failureMessages {
		t.Errorf("a plain error is kind %d, want messages", kind)
	}
}
