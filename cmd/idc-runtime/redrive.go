package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/process"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/redrive"
)

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	if v == "" {
		return errors.New("must not be empty")
	}
	*l = append(*l, v)
	return nil
}

// reasonClasses are the values --reason accepts: the dead-letter reason
// classes (the idc_dead_letters_total label).
var reasonClasses = inbox.DeadLetterClasses

// redriveFlags are the flags of the redrive command.
type redriveFlags struct {
	commonFlags
	reasons, ids stringList
	since, until string
	limit        int
	dryRun       bool
	run          string
}

func redriveCommand(args []string, stdout, stderr io.Writer) int {
	var f redriveFlags
	fs := flag.NewFlagSet("redrive", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs)
	fs.Var(&f.reasons, "reason", "redrive only dead letters of this reason class (repeatable): "+strings.Join(reasonClasses, ", "))
	fs.Var(&f.ids, "id", "redrive only this message id (repeatable)")
	fs.StringVar(&f.since, "since", "", "only dead letters since this time (RFC 3339, or a duration ago such as 24h)")
	fs.StringVar(&f.until, "until", "", "only dead letters before this time (RFC 3339, or a duration ago)")
	fs.IntVar(&f.limit, "limit", 0, "redrive at most this many dead letters (0: no limit)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "settle each row and roll back: report what a run would do, change nothing")
	fs.StringVar(&f.run, "run", "", "name of this run in the <inbox>_redrives table (default: cli-<UTC time>)")
	if err := parseFlags(fs, args); err != nil {
		return exitCode(err)
	}
	cfg, log, err := f.setup("redrive", stderr)
	if err != nil {
		return report(log, err)
	}
	now := time.Now()
	opts, err := f.options(now)
	if err != nil {
		return report(log, withCode(exitUsage, err))
	}
	ctx, stop := process.SignalContext()
	defer stop()
	pool, err := newPool(cfg)
	if err != nil {
		return report(log, err)
	}
	defer pool.Close()
	r, err := redrive.New(pool, cfg, log)
	if err != nil {
		return report(log, withCode(exitUsage, err))
	}
	res, runErr := r.Run(ctx, opts)
	b, err := json.Marshal(res)
	if err != nil {
		return report(log, err)
	}
	_, _ = fmt.Fprintln(stdout, string(b))
	if runErr != nil {
		return report(log, runErr)
	}
	log.Info("Redrive finished", "run", res.Run, "dryRun", res.DryRun, "selected", res.Selected, "applied", res.Applied,
		"duplicates", res.Duplicates, "stale", res.Stale, "stillFailing", res.StillFailing, "unusable", res.Unusable, "requeued", res.Requeued, "skipped", res.Skipped)
	return exitOK
}

func (f *redriveFlags) options(now time.Time) (redrive.Options, error) {
	opts := redrive.Options{Run: f.run, DryRun: f.dryRun}
	if opts.Run == "" {
		opts.Run = "cli-" + now.UTC().Format("20060102T150405Z")
	}
	for _, r := range f.reasons {
		if !contains(reasonClasses, r) {
			return opts, fmt.Errorf("--reason %q is not a reason class (one of %s)", r, strings.Join(reasonClasses, ", "))
		}
	}
	if f.limit < 0 {
		return opts, fmt.Errorf("--limit must be 0 (no limit) or more, got %d", f.limit)
	}
	since, err := parseTimeFlag("--since", f.since, now)
	if err != nil {
		return opts, err
	}
	until, err := parseTimeFlag("--until", f.until, now)
	if err != nil {
		return opts, err
	}
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		return opts, fmt.Errorf("--since (%s) must be before --until (%s)", since.Format(time.RFC3339), until.Format(time.RFC3339))
	}
	opts.Filter = inbox.DeadLetterFilter{Classes: f.reasons, MessageIDs: f.ids, Since: since, Until: until, Limit: f.limit}
	return opts, nil
}

// parseTimeFlag reads an RFC 3339 time or a duration before now.
func parseTimeFlag(name, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%s %q is neither an RFC 3339 time nor a positive duration ago", name, v)
	}
	return now.Add(-d), nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
