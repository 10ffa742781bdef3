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
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
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

// newPool builds the pool from the DSN in the environment variable the
// config names. It does not connect: the first use does, so a database that
// is down is handled by the caller's retries. The DSN is never put in an
// error or a log.
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
		pc.ConnConfig.RuntimeParams["application_name"] = "idc-runtime"
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		// One connection per in-flight transaction, plus the stats and
		// partition upkeep; with emit, one per relay worker as well.
		conns := cfg.Delivery.InFlight + 2
		if cfg.UsesOutbox() {
			conns += cfg.Delivery.InFlight
		}
		pc.MaxConns = max(pc.MaxConns, int32(conns))
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("while creating the PostgreSQL pool: %w", err)
	}
	return pool, nil
}

// openStore builds the pool (newPool) and the inbox store the config names;
// the caller closes the pool. A config the store refuses is a usage error.
func openStore(cfg *config.Config) (*pgxpool.Pool, *inbox.Store, error) {
	pool, err := newPool(cfg)
	if err != nil {
		return nil, nil, err
	}
	store, err := inbox.ForConfig(pool, cfg)
	if err != nil {
		pool.Close()
		return nil, nil, withCode(exitUsage, err)
	}
	return pool, store, nil
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
