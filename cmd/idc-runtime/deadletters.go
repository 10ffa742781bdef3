package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/process"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// DeadLetterListKind marks the one JSON line `deadletters` prints, so a
// reader of a pod's log (kubectl idc deadletters) tells it from log lines.
const DeadLetterListKind = "DeadLetterList"

// deadLetterList is what `deadletters` prints.
type deadLetterList struct {
	Kind  string `json:"kind"`
	Inbox string `json:"inbox"`
	inbox.DeadLetterListing
}

type deadLettersFlags struct {
	commonFlags
	selectionFlags
	excerpt int
	output  string
}

// deadLettersCommand lists the dead letters as one JSON line on stdout. It
// only reads: it never migrates or changes a row.
func deadLettersCommand(args []string, stdout, stderr io.Writer) int {
	var f deadLettersFlags
	fs := f.flagSet("deadletters", stderr)
	f.registerSelection(fs, "list", 50, "list at most this many dead letters, oldest first (0: no limit); the total is counted without it")
	fs.IntVar(&f.excerpt, "excerpt", 200, "cut each reason to this many characters")
	fs.StringVar(&f.output, "o", "json", "output format: json (one line)")
	if err := parseFlags(fs, args); err != nil {
		return exitCode(err)
	}
	cfg, log, err := f.setup("deadletters", stderr)
	if err != nil {
		return report(log, err)
	}
	filter, err := f.filter()
	if err != nil {
		return report(log, withCode(exitUsage, err))
	}
	ctx, stop := process.SignalContext()
	defer stop()
	db, store, ok, err := openSinkInbox(ctx, cfg, log)
	if err != nil || !ok {
		return report(log, errors.Join(err, ctx.Err()))
	}
	defer db.Close()
	listing, err := store.ListDeadLetters(ctx, filter, f.excerpt)
	if err != nil {
		return report(log, err)
	}
	b, err := json.Marshal(deadLetterList{Kind: DeadLetterListKind, Inbox: cfg.Sink.Schema + "." + cfg.Sink.InboxTable, DeadLetterListing: listing})
	if err != nil {
		return report(log, fmt.Errorf("while encoding the dead letters: %w", err))
	}
	_, _ = fmt.Fprintln(stdout, string(b))
	return exitOK
}

func (f *deadLettersFlags) filter() (inbox.DeadLetterFilter, error) {
	switch {
	case f.excerpt <= 0:
		return inbox.DeadLetterFilter{}, fmt.Errorf("--excerpt must be positive, got %d", f.excerpt)
	case f.output != "json":
		return inbox.DeadLetterFilter{}, fmt.Errorf("-o must be json, got %q", f.output)
	}
	return f.selection().Filter(time.Now())
}
