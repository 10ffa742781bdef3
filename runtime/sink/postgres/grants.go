package postgres

import (
	"errors"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// Least privilege on PostgreSQL (docs/mysql.md has the MySQL side). The
// runtime's role needs USAGE on the schema, the data privileges on the
// inbox's tables, USAGE on their id sequences, and for the Partitioned
// layout ownership of the inbox table and CREATE on the schema: PostgreSQL
// lets only the parent's owner create a partition of it (EnsurePartitions)
// and only a partition's owner drop it (PrunePartitions), and the
// partitions the runtime creates are its own.
//
// The optional tables, for an inbox that uses them (the inbox.Options the
// runtime opens it with):
//
//   - <inbox>_outbox: SELECT, INSERT, UPDATE, DELETE. WriteOutbox is INSERT
//     … ON CONFLICT (event_id) DO NOTHING (INSERT, and SELECT for the
//     conflict target), RequeueOutbox the same with DO UPDATE (UPDATE); the
//     relay locks its events FOR UPDATE (SELECT, UPDATE), MarkOutboxSent
//     and NoteOutboxFailure update them (… RETURNING: SELECT);
//     DeadLetterOutbox and PruneOutbox delete. The relay's shard lock is an
//     advisory lock, which needs no privilege;
//   - <inbox>_redrives: SELECT, INSERT (RecordRedrive, RedriveSummary);
//     the rest of a redrive is on the dead letters, already granted.
//
// Their bigserial ids take USAGE on their sequences, which the grant on
// the schema's sequences gives when it runs after the tables exist (as
// every GRANT on a table must): the controller creates the outbox, and
// under these grants the redrives log is created beforehand by the
// tables' owner (a Migrate with WithRedrives). A Migrate under these
// grants then finds every table and runs no DDL.

// RuntimeGrants are the statements that give role what the runtime needs
// on the inbox n in layout, with the optional tables opts asks for (the
// options the runtime opens the inbox with; none: the inbox's own tables
// only); run by the tables' owner.
func RuntimeGrants(n inbox.Names, layout config.Layout, role string, opts ...inbox.Option) []string {
	var o inbox.Options
	for _, opt := range opts {
		opt(&o)
	}
	r := pgx.Identifier{role}.Sanitize()
	q := func(t string) string { return pgx.Identifier{n.Schema, t}.Sanitize() }
	out := []string{
		"GRANT USAGE ON SCHEMA " + pgx.Identifier{n.Schema}.Sanitize() + " TO " + r,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + q(n.Inbox) + ", " + q(n.DeadLetters) + ", " + q(n.Progress) + " TO " + r,
		"GRANT SELECT, INSERT, UPDATE ON " + q(n.PruneRuns) + ", " + q(n.Window) + " TO " + r,
		"GRANT SELECT, INSERT ON " + q(n.IDConflicts) + " TO " + r,
		"GRANT SELECT ON " + q(n.Meta) + " TO " + r,
	}
	if o.Outbox {
		out = append(out, "GRANT SELECT, INSERT, UPDATE, DELETE ON "+q(n.Outbox)+" TO "+r)
	}
	if o.Redrives {
		out = append(out, "GRANT SELECT, INSERT ON "+q(n.Redrives)+" TO "+r)
	}
	// The bigserial ids of dead letters, prune runs, conflicts, and of the
	// outbox and redrives when they exist.
	out = append(out, "GRANT USAGE ON ALL SEQUENCES IN SCHEMA "+pgx.Identifier{n.Schema}.Sanitize()+" TO "+r)
	if layout == config.LayoutPartitioned {
		out = append(out, "GRANT CREATE ON SCHEMA "+pgx.Identifier{n.Schema}.Sanitize()+" TO "+r,
			"ALTER TABLE "+q(n.Inbox)+" OWNER TO "+r)
	}
	return out
}

// PrivilegeError is a privilege error (SQLSTATE 42501) with the GRANT that
// fixes it; errors.As still finds the *pgconn.PgError (Classify).
type PrivilegeError struct {
	Err   error
	Grant string
}

func (e *PrivilegeError) Error() string {
	return e.Err.Error() + " (to grant it, run: " + e.Grant + ")"
}
func (e *PrivilegeError) Unwrap() error { return e.Err }

var deniedRE = regexp.MustCompile(`^permission denied for (table|schema|sequence) "?([^" ]+)"?$`)

// Advice is the GRANT that gives role what err (a 42501 from an operation
// that needs privileges on its tables) lacked, "" when err is not one.
// PostgreSQL names the table or schema but not the privilege, so the
// operation says which it needs.
func Advice(err error, schema, privileges, role string) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		return ""
	}
	m := deniedRE.FindStringSubmatch(pe.Message)
	if m == nil {
		return ""
	}
	r := pgx.Identifier{role}.Sanitize()
	switch m[1] {
	case "schema":
		return "GRANT USAGE ON SCHEMA " + pgx.Identifier{m[2]}.Sanitize() + " TO " + r
	case "sequence":
		return "GRANT USAGE ON SEQUENCE " + pgx.Identifier{schema, m[2]}.Sanitize() + " TO " + r
	}
	return "GRANT " + privileges + " ON " + pgx.Identifier{schema, m[2]}.Sanitize() + " TO " + r
}

// advise wraps a privilege error of an operation needing privileges on
// the inbox's tables (nothing on success: the claim path pays nothing).
func (i Inbox) advise(err error, privileges string) error {
	if err == nil {
		return nil
	}
	var pe *PrivilegeError
	if errors.As(err, &pe) {
		return err
	}
	if g := Advice(err, i.Names().Schema, privileges, i.pool.Config().ConnConfig.User); g != "" {
		return &PrivilegeError{Err: err, Grant: g}
	}
	return err
}

// adviseEach is advise for an operation on several tables, each needing
// its own privileges (by unqualified name; the message names the table).
func (i Inbox) adviseEach(err error, privileges map[string]string) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if m := deniedRE.FindStringSubmatch(pe.Message); m != nil && m[1] == "table" {
			if p := privileges[m[2]]; p != "" {
				return i.advise(err, p)
			}
			return err
		}
	}
	return i.advise(err, "") // a schema or a sequence: Advice knows the privilege
}
