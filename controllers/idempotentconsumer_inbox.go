package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// dbTimeout bounds every database round of a reconcile so an unreachable
// database costs seconds, not a stuck worker.
const dbTimeout = 10 * time.Second

// InboxClient provisions, inspects and drops the inbox tables of one
// consumer in its sink database (observe / ensure / delete).
type InboxClient interface {
	// Ensure creates the schema and tables idempotently and returns the
	// schema version now in place.
	Ensure(ctx context.Context, dsn string, sink config.Sink) (int, error)
	// LastPrune returns the latest prune run, nil when none ran yet.
	LastPrune(ctx context.Context, dsn string, sink config.Sink) (*inbox.PruneRun, error)
	// Drop drops the tables; dropping what is gone succeeds.
	Drop(ctx context.Context, dsn string, sink config.Sink) error
}

// PostgresInbox is the InboxClient on runtime/inbox: the controller and the
// runtime share one DDL.
type PostgresInbox struct{}

// errInvalidDSN marks a DSN that cannot be parsed; the parse error itself is
// not kept because it may echo the DSN, password included.
var errInvalidDSN = errors.New("the connection string cannot be parsed")

func (PostgresInbox) with(ctx context.Context, dsn string, sink config.Sink, fn func(*inbox.Store) error) error {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return errInvalidDSN
	}
	pc.MaxConns = 1
	pc.ConnConfig.ConnectTimeout = dbTimeout
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("while connecting to the sink database: %w", err)
	}
	defer pool.Close()
	store, err := inbox.New(pool, sink)
	if err != nil {
		return err
	}
	return fn(store)
}

// Ensure implements InboxClient.
func (p PostgresInbox) Ensure(ctx context.Context, dsn string, sink config.Sink) (int, error) {
	var v int
	err := p.with(ctx, dsn, sink, func(s *inbox.Store) error {
		if err := s.Migrate(ctx); err != nil {
			return err
		}
		var err error
		v, err = s.SchemaVersion(ctx)
		return err
	})
	return v, err
}

// LastPrune implements InboxClient.
func (p PostgresInbox) LastPrune(ctx context.Context, dsn string, sink config.Sink) (*inbox.PruneRun, error) {
	var run *inbox.PruneRun
	err := p.with(ctx, dsn, sink, func(s *inbox.Store) error {
		var err error
		run, err = s.LastPruneRun(ctx)
		return err
	})
	return run, err
}

// Drop implements InboxClient.
func (p PostgresInbox) Drop(ctx context.Context, dsn string, sink config.Sink) error {
	return p.with(ctx, dsn, sink, func(s *inbox.Store) error { return s.Drop(ctx) })
}

// classifyDBError maps a database error to a condition reason and a message
// an on-call engineer can act on. Messages never contain the DSN.
func classifyDBError(err error, ref messagingv1alpha1.SecretKeyRef) (string, string) {
	where := fmt.Sprintf("the database named by Secret %q key %q", ref.Name, ref.Key)
	if errors.Is(err, errInvalidDSN) {
		return messagingv1alpha1.ReasonInvalidDSN, fmt.Sprintf("the connection string in Secret %q key %q cannot be parsed; expected postgres://user:password@host:5432/db or key=value form", ref.Name, ref.Key)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "42501" || strings.HasPrefix(pgErr.Code, "28"):
			return messagingv1alpha1.ReasonPermissionDenied, fmt.Sprintf("permission denied on %s (SQLSTATE %s: %s); grant the role CREATE on the database and schema", where, pgErr.Code, pgErr.Message)
		case pgErr.Code == "3D000":
			return messagingv1alpha1.ReasonDatabaseError, fmt.Sprintf("%s does not exist (SQLSTATE %s: %s)", where, pgErr.Code, pgErr.Message)
		}
		return messagingv1alpha1.ReasonDatabaseError, fmt.Sprintf("provisioning the inbox in %s failed (SQLSTATE %s: %s)", where, pgErr.Code, pgErr.Message)
	}
	return messagingv1alpha1.ReasonDatabaseError, fmt.Sprintf("cannot reach %s: %s; retrying with backoff", where, redact(err.Error()))
}

// redact drops anything that looks like a password from a driver message.
func redact(s string) string {
	fields := strings.Fields(s)
	for i, f := range fields {
		if strings.HasPrefix(strings.ToLower(strings.Trim(f, "`'\"")), "password=") {
			fields[i] = "password=<redacted>"
		}
	}
	return strings.Join(fields, " ")
}

// inboxStatusFor is status.inbox for a provisioned inbox.
func inboxStatusFor(cfg *config.Config, version int) *messagingv1alpha1.InboxStatus {
	return &messagingv1alpha1.InboxStatus{
		Table:         cfg.Sink.Schema + "." + cfg.Sink.InboxTable,
		Layout:        messagingv1alpha1.InboxLayout(cfg.Sink.Layout),
		SchemaVersion: int32(version),
	}
}
