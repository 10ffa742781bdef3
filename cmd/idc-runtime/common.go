package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pause"
	"github.com/idempotency-dev/idc-operator/internal/process"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/sink/mysql"
	"github.com/idempotency-dev/idc-operator/runtime/sink/postgres"
	"github.com/idempotency-dev/idc-operator/runtime/version"
)

// commonFlags are the flags every config-reading command takes.
type commonFlags struct {
	configPath string
	logLevel   string
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.configPath, "config", "", "path of the runtime config file (JSON)")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: info or debug")
}

// flagSet is a command's flag set, with the common flags registered into c;
// its errors and -h go to stderr.
func (c *commonFlags) flagSet(command string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.register(fs)
	return fs
}

// parseFlags parses args; -h is not an error.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return withCode(exitUsage, err)
	}
	if fs.NArg() > 0 {
		return withCode(exitUsage, fmt.Errorf("unexpected arguments: %v", fs.Args()))
	}
	return nil
}

// setup reads the flags' logger and config; errors are usage errors.
func (c *commonFlags) setup(command string, stderr io.Writer) (*config.Config, logr.Logger, error) {
	log, err := process.NewLogger(c.logLevel, stderr)
	if err != nil {
		return nil, log, withCode(exitUsage, err)
	}
	log = log.WithValues("command", command, "version", version.Version)
	if c.configPath == "" {
		return nil, log, withCode(exitUsage, errors.New("--config is required"))
	}
	cfg, err := config.Load(c.configPath)
	if err != nil {
		return nil, log, withCode(exitUsage, fmt.Errorf("while loading config %s: %w", c.configPath, err))
	}
	return cfg, log.WithValues("idc", cfg.Name), nil
}

// sinkConns is the connection pool's size: one connection per in-flight
// transaction, plus the stats and partition upkeep; with emit, one per
// relay worker as well. The same for both databases.
func sinkConns(cfg *config.Config) int {
	conns := cfg.Delivery.InFlight + 2
	if cfg.UsesOutbox() {
		conns += cfg.Delivery.InFlight
	}
	return conns
}

// openSink opens the sink database the config names (sink.kind): a pgx
// pool for PostgreSQL, which does not connect (the first use does, so a
// database that is down is handled by the caller's retries); for MySQL or
// MariaDB, a database/sql pool that reads the server's version first (its
// claim statement depends on it), retried here on the bounded backoff while
// the server is down. ok is false when ctx ended first. The DSN is never put
// in an error or a log. The caller closes the DB.
func openSink(ctx context.Context, cfg *config.Config, log logr.Logger) (db sink.DB, ok bool, err error) {
	if cfg.Sink.DatabaseKind() != config.SinkMySQL {
		pool, err := newPool(cfg)
		if err != nil {
			return nil, false, err
		}
		return postgres.New(pool), true, nil
	}
	name := cfg.Sink.DSNEnv
	dsn := os.Getenv(name)
	if dsn == "" {
		return nil, false, withCode(exitUsage, fmt.Errorf("environment variable %s (sink.dsnEnv, the MySQL DSN) is not set or empty", name))
	}
	if _, err := mysql.ParseDSN(dsn); err != nil {
		// The parse error may quote parts of the DSN: it is not wrapped.
		return nil, false, withCode(exitUsage, fmt.Errorf("environment variable %s does not hold a valid MySQL DSN (user:password@tcp(host:3306)/database)", name))
	}
	m, ok := retry(ctx, log, "connect to the sink database", cfg.Delivery, func(ctx context.Context) (*mysql.DB, error) {
		return mysql.Open(ctx, dsn)
	})
	if !ok {
		return nil, false, nil
	}
	m.SetMaxConns(sinkConns(cfg))
	log.Info("Sink database", "kind", string(sink.MySQL), "server", m.Version())
	return m, true, nil
}

// openSinkInbox is openSink and the inbox the config names; a config the
// inbox refuses is a usage error. The caller closes the DB.
func openSinkInbox(ctx context.Context, cfg *config.Config, log logr.Logger) (sink.DB, sink.Inbox, bool, error) {
	db, ok, err := openSink(ctx, cfg, log)
	if err != nil || !ok {
		return nil, nil, ok, err
	}
	store, err := sink.InboxFor(db, cfg)
	if err != nil {
		db.Close()
		return nil, nil, false, withCode(exitUsage, err)
	}
	return db, store, true, nil
}

// applicationName is what the runtime's sessions show in
// pg_stat_activity: "idc-runtime", and a partition's replicas "idc-runtime
// p<i>", so a lock wait between partitions can be told from one inside a
// partition.
func applicationName(cfg *config.Config) string {
	if j := cfg.Source.NATSJetStream; j != nil && j.OnePartition {
		return fmt.Sprintf("idc-runtime p%d", j.PartitionIndex)
	}
	return "idc-runtime"
}

// newPool builds the PostgreSQL pool from the DSN in the environment
// variable the config names. It does not connect.
func newPool(cfg *config.Config) (*pgxpool.Pool, error) {
	name := cfg.Sink.DSNEnv
	dsn := os.Getenv(name)
	if dsn == "" {
		return nil, withCode(exitUsage, fmt.Errorf("environment variable %s (sink.dsnEnv, the PostgreSQL connection string) is not set or empty", name))
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The parse error may quote parts of the DSN: it is not wrapped.
		return nil, withCode(exitUsage, fmt.Errorf("environment variable %s does not hold a valid PostgreSQL connection string", name))
	}
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = applicationName(cfg)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		pc.MaxConns = max(pc.MaxConns, int32(sinkConns(cfg)))
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("while creating the PostgreSQL pool: %w", err)
	}
	return pool, nil
}

// report logs a command's failure and returns its exit code.
func report(log logr.Logger, err error) int {
	code := exitCode(err)
	if code != exitOK {
		log.Error(err, "Command failed", "exitCode", code)
	}
	return code
}

// attemptTimeout bounds one startup attempt, so a dial that hangs is retried
// instead of blocking the start forever.
const attemptTimeout = 30 * time.Second

// retry runs fn until it succeeds or ctx ends, logging every failed attempt.
// ok is false when ctx ended first.
func retry[T any](ctx context.Context, log logr.Logger, step string, d config.Delivery, fn func(context.Context) (T, error)) (T, bool) {
	var zero T
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		v, err := fn(actx)
		cancel()
		if err == nil {
			if n > 1 {
				log.Info("Startup step succeeded after retries", "step", step, "attempts", n)
			}
			return v, true
		}
		if ctx.Err() != nil {
			return zero, false
		}
		wait := pause.Exponential(n, d.BackoffInitial.Duration, d.BackoffMax.Duration)
		log.Error(err, "Startup step failed; retrying", "step", step, "attempt", n, "retryIn", wait.String())
		if !pause.For(ctx, wait) {
			return zero, false
		}
	}
}
