// Command idc-runtime is the data plane of idc-operator: the consumer that
// turns at-least-once delivery into an exactly-once effect, and the prune job
// of its inbox (DESIGN.md sections 5 to 7).
//
// Usage:
//
//	idc-runtime run     --config FILE [--log-level info|debug] [--consumer-name NAME]
//	idc-runtime migrate --config FILE [--log-level info|debug]
//	idc-runtime prune   --config FILE [--window DURATION] [--log-level info|debug]
//	idc-runtime redrive --config FILE [--reason CLASS]... [--id ID]... [--since T] [--until T] [--limit N] [--dry-run] [--run NAME]
//	idc-runtime deadletters --config FILE [--reason CLASS]... [--id ID]... [--limit N] [--excerpt N] [-o json]
//	idc-runtime version
//
// run consumes until SIGTERM or SIGINT, then finishes the batch in flight and
// exits 0. A database or broker that is down at startup is retried with
// backoff (each attempt logged, /readyz false meanwhile), never a reason to
// exit. --consumer-name defaults to $POD_NAME, else the host name.
//
// migrate creates the inbox, dead-letter and bookkeeping tables (idempotent).
//
// prune deletes inbox rows (Table layout) or drops day partitions
// (Partitioned layout) older than the retention window. It re-derives the
// window from the broker and uses the larger of its own and --window (the
// controller's); when neither is known, or replay is unbounded, it deletes
// nothing and exits 3.
//
// redrive replays dead letters exactly once through the consumer's own
// claim + effect path, one transaction per row that also deletes it (or
// records its new failure) and logs the outcome in <inbox>_redrives; it
// prints one JSON line of counts. Safe to repeat and next to live replicas.
// A misconfigured sink or an unreachable database stops it with exit 1 and
// the row unchanged.
//
// deadletters prints the dead letters (id, message id, reason class, an
// excerpt of the reason, attempts, when) as one JSON line, oldest first, with
// the total the filter selects; no payload. It only reads. `kubectl idc
// deadletters` runs it in a short-lived Job with the resource's own config
// and Secret, so the credentials stay in the cluster.
//
// Exit codes:
//
//	0  success; for run, a graceful stop after SIGTERM/SIGINT
//	1  the operation failed (database error, server failure, ...)
//	2  usage or configuration error (bad flags, invalid config, missing env var)
//	3  prune refused: no safe retention window is known; nothing was deleted
//
// A run killed by the chaos failpoint below dies of SIGKILL (137 in a shell).
//
// Environment: the config names the variables holding credentials (the
// PostgreSQL DSN in sink.dsnEnv, broker credentials); their values are never
// logged. IDC_FAILPOINT=after-commit-before-ack makes run SIGKILL itself after
// a batch has committed and before it is acknowledged. It exists only for
// chaos tests (proving that a crash in that gap causes no second effect) and
// must never be set in production.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/idempotency-dev/idc-operator/runtime/version"
)

// Exit codes; see the package comment.
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	exitRefused = 3
)

// exitError carries the exit code of a failure up to main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &exitError{code: code, err: err}
}

// exitCode maps an error to the process exit code; unclassified errors are
// failures.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	return exitFailed
}

const usage = `usage: idc-runtime <command> [flags]

commands:
  run      consume messages (--config FILE [--log-level info|debug] [--consumer-name NAME])
  migrate  create the inbox tables and exit (--config FILE)
  prune    delete inbox entries older than the retention window (--config FILE [--window DURATION])
  redrive  replay dead letters exactly once (--config FILE [--reason CLASS]... [--id ID]... [--since T] [--until T] [--limit N] [--dry-run] [--run NAME])
  deadletters  list dead letters as JSON, without payloads (--config FILE [--reason CLASS]... [--id ID]... [--limit N] [--excerpt N])
  version  print the version
`

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		_, _ = fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return runCommand(args[1:], stderr)
	case "migrate":
		return migrateCommand(args[1:], stderr)
	case "prune":
		return pruneCommand(args[1:], stderr)
	case "redrive":
		return redriveCommand(args[1:], stdout, stderr)
	case "deadletters":
		return deadLettersCommand(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		_, _ = fmt.Fprintln(stdout, version.String())
		return exitOK
	case "help", "-h", "--help":
		_, _ = fmt.Fprint(stdout, usage)
		return exitOK
	}
	_, _ = fmt.Fprintf(stderr, "idc-runtime: unknown command %q\n%s", args[0], usage)
	return exitUsage
}
