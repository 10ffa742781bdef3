package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
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
	// AdoptWindow applies the shrink rule to a derived window against the
	// state kept in the inbox (retention.AdoptStored) and returns what is
	// now in force; pendingShrink is true while a smaller window waits.
	AdoptWindow(ctx context.Context, dsn string, sink config.Sink, derived retention.Result, now time.Time) (applied retention.Applied, pendingShrink bool, err error)
	// StoredWindow reads that state without changing it; nil when none is
	// stored yet.
	StoredWindow(ctx context.Context, dsn string, sink config.Sink) (*retention.Applied, error)
}

// PostgresInbox is the InboxClient on runtime/inbox: the controller and the
// runtime share one DDL. Pools are kept per DSN (most resources share a
// database), so a reconcile does not pay a new connection each time; idle
// connections are closed after a minute.
type PostgresInbox struct {
	mu    sync.Mutex
	pools map[string]*pgxpool.Pool
}

// NewPostgresInbox returns an InboxClient with an empty pool cache.
func NewPostgresInbox() *PostgresInbox {
	return &PostgresInbox{pools: map[string]*pgxpool.Pool{}}
}

// errInvalidDSN marks a DSN that cannot be parsed; the parse error itself is
// not kept because it may echo the DSN, password included.
var errInvalidDSN = errors.New("the connection string cannot be parsed")

func (p *PostgresInbox) pool(dsn string) (*pgxpool.Pool, error) {
	sum := sha256.Sum256([]byte(dsn))
	key := hex.EncodeToString(sum[:])
	p.mu.Lock()
	defer p.mu.Unlock()
	if pool, ok := p.pools[key]; ok {
		return pool, nil
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errInvalidDSN
	}
	pc.MaxConns = 4
	pc.MinConns = 0
	pc.MaxConnIdleTime = time.Minute
	pc.ConnConfig.ConnectTimeout = dbTimeout
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("while creating a pool for the sink database: %w", err)
	}
	p.pools[key] = pool
	return pool, nil
}

func (p *PostgresInbox) with(ctx context.Context, dsn string, sink config.Sink, fn func(context.Context, *inbox.Store) error) error {
	pool, err := p.pool(dsn)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	store, err := inbox.New(pool, sink)
	if err != nil {
		return err
	}
	return fn(ctx, store)
}

// Ensure implements InboxClient. An inbox already at this version costs one
// query; only a missing or older one runs the DDL.
func (p *PostgresInbox) Ensure(ctx context.Context, dsn string, sink config.Sink) (int, error) {
	var v int
	err := p.with(ctx, dsn, sink, func(ctx context.Context, s *inbox.Store) error {
		var err error
		if v, err = s.SchemaVersion(ctx); err != nil || v == inbox.SchemaVersion {
			return err
		}
		if err := s.Migrate(ctx); err != nil {
			return err
		}
		v, err = s.SchemaVersion(ctx)
		return err
	})
	return v, err
}

// LastPrune implements InboxClient.
func (p *PostgresInbox) LastPrune(ctx context.Context, dsn string, sink config.Sink) (*inbox.PruneRun, error) {
	var run *inbox.PruneRun
	err := p.with(ctx, dsn, sink, func(ctx context.Context, s *inbox.Store) error {
		var err error
		run, err = s.LastPruneRun(ctx)
		return err
	})
	return run, err
}

// Drop implements InboxClient.
func (p *PostgresInbox) Drop(ctx context.Context, dsn string, sink config.Sink) error {
	return p.with(ctx, dsn, sink, func(ctx context.Context, s *inbox.Store) error { return s.Drop(ctx) })
}

// AdoptWindow implements InboxClient.
func (p *PostgresInbox) AdoptWindow(ctx context.Context, dsn string, sink config.Sink, derived retention.Result, now time.Time) (retention.Applied, bool, error) {
	var applied retention.Applied
	var pending bool
	err := p.with(ctx, dsn, sink, func(ctx context.Context, s *inbox.Store) error {
		var err error
		applied, pending, err = retention.AdoptStored(ctx, s, derived, now)
		return err
	})
	return applied, pending, err
}

// StoredWindow implements InboxClient.
func (p *PostgresInbox) StoredWindow(ctx context.Context, dsn string, sink config.Sink) (*retention.Applied, error) {
	var applied *retention.Applied
	err := p.with(ctx, dsn, sink, func(ctx context.Context, s *inbox.Store) error {
		var err error
		applied, err = retention.StoredApplied(ctx, s)
		return err
	})
	return applied, err
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
		return messagingv1alpha1.ReasonProvisioningFailed, fmt.Sprintf("provisioning the inbox in %s failed (SQLSTATE %s: %s)", where, pgErr.Code, pgErr.Message)
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
