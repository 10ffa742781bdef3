package main

import (
	"errors"
	"flag"
	"strings"

	"github.com/idempotency-dev/idc-operator/internal/deadletterflags"
)

// selectionFlags are the dead-letter selection flags of deadletters and
// redrive; internal/deadletterflags checks them.
type selectionFlags struct {
	reasons, ids stringList
	limit        int
}

// registerSelection adds --reason, --id and --limit; verb says what the command does
// with the dead letters selected ("list", "redrive").
func (s *selectionFlags) registerSelection(fs *flag.FlagSet, verb string, defaultLimit int, limitUsage string) {
	fs.Var(&s.reasons, "reason", verb+" only dead letters of this reason class (repeatable): "+deadletterflags.ReasonClasses())
	fs.Var(&s.ids, "id", verb+" only this message id (repeatable)")
	fs.IntVar(&s.limit, "limit", defaultLimit, limitUsage)
}

func (s *selectionFlags) selection() deadletterflags.Selection {
	return deadletterflags.Selection{Reasons: s.reasons, IDs: s.ids, Limit: s.limit}
}

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
