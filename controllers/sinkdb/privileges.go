package sinkdb

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/errtext"
)

// explainInboxPrivilege turns a migration that PostgreSQL refused for want
// of a privilege (SQLSTATE 42501) into a problem naming the one grant
// missing: what the role needs is USAGE and CREATE on the inbox's schema
// (CREATE on the database only when the schema does not exist yet), or to
// own the inbox tables it alters. Any other error is returned as it is.
func explainInboxPrivilege(ctx context.Context, pool *pgxpool.Pool, schema string, migrateErr error) error {
	var pgErr *pgconn.PgError
	if migrateErr == nil || !errors.As(migrateErr, &pgErr) || pgErr.Code != "42501" {
		return migrateErr
	}
	var role, database string
	var schemaExists, usage, create, createDB bool
	err := pool.QueryRow(ctx, `SELECT current_user, current_database(),
			n.oid IS NOT NULL,
			n.oid IS NOT NULL AND has_schema_privilege(n.oid, 'USAGE'),
			n.oid IS NOT NULL AND has_schema_privilege(n.oid, 'CREATE'),
			has_database_privilege(current_database(), 'CREATE')
		FROM (SELECT 1) one LEFT JOIN pg_namespace n ON n.nspname = $1`, schema).
		Scan(&role, &database, &schemaExists, &usage, &create, &createDB)
	if err != nil {
		return fmt.Errorf("while reading the sink role's privileges after %w", migrateErr)
	}
	r, s, d := pgx.Identifier{role}.Sanitize(), pgx.Identifier{schema}.Sanitize(), pgx.Identifier{database}.Sanitize()
	switch {
	case !schemaExists && !createDB:
		return problem(messagingv1alpha1.ReasonPermissionDenied,
			"role %s cannot create schema %s: it lacks CREATE on database %s; create the schema for it (CREATE SCHEMA %s AUTHORIZATION %s) or grant it that (GRANT CREATE ON DATABASE %s TO %s)",
			r, s, d, s, r, d, r)
	case schemaExists && !usage:
		return problem(messagingv1alpha1.ReasonPermissionDenied,
			"role %s lacks USAGE on schema %s; run GRANT USAGE, CREATE ON SCHEMA %s TO %s", r, s, s, r)
	case schemaExists && !create:
		return problem(messagingv1alpha1.ReasonPermissionDenied,
			"role %s lacks CREATE on schema %s (the inbox tables are created there); run GRANT CREATE ON SCHEMA %s TO %s", r, s, s, r)
	}
	// The schema grants are there: an inbox table exists that the role
	// does not own (created by another role), and only its owner may
	// alter it. PostgreSQL's message names the table.
	return problem(messagingv1alpha1.ReasonPermissionDenied,
		"role %s may not migrate the inbox in schema %s (SQLSTATE 42501: %s); the inbox tables are altered by their owner: ALTER TABLE ... OWNER TO %s, or point the Secret at the owning role",
		r, s, errtext.Sanitize(pgErr.Message), r)
}
