package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/process"
	"github.com/idempotency-dev/idc-operator/runtime/redrive"
)

// redriveFlags are the flags of the redrive command.
type redriveFlags struct {
	commonFlags
	selectionFlags
	since, until string
	dryRun       bool
	run          string
}

func redriveCommand(args []string, stdout, stderr io.Writer) int {
	var f redriveFlags
	fs := f.flagSet("redrive", stderr)
	f.registerSelection(fs, "redrive", 0, "redrive at most this many dead letters (0: no limit)")
	fs.StringVar(&f.since, "since", "", "only dead letters since this time (RFC 3339, or a duration ago such as 24h)")
	fs.StringVar(&f.until, "until", "", "only dead letters before this time (RFC 3339, or a duration ago)")
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
	db, ok, err := openSink(ctx, cfg, log)
	if err != nil || !ok {
		return report(log, errors.Join(err, ctx.Err()))
	}
	defer db.Close()
	r, err := redrive.New(db, cfg, log)
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
	sel := f.selection()
	sel.Since, sel.Until = f.since, f.until
	filter, err := sel.Filter(now)
	opts.Filter = filter
	return opts, err
}
