// Package deadletterflags is the one parser of the flags that select dead
// letters: --reason, --id, --limit, and idc-runtime redrive's --since and
// --until. idc-runtime (deadletters, redrive) and kubectl idc (deadletters,
// redrive) register them with their own flag libraries, help texts and
// defaults, and turn what was given into the inbox's filter here, so a value
// one refuses the other refuses with the same message.
package deadletterflags

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// Selection is what the flags gave.
type Selection struct {
	// Reasons are --reason: dead-letter reason classes (inbox.DeadLetterClasses).
	Reasons []string
	// IDs are --id: message ids.
	IDs []string
	// Limit is --limit: at most this many dead letters; 0 is no limit.
	Limit int
	// Since and Until are --since and --until: an RFC 3339 time or a
	// duration before now (24h); empty leaves that end open.
	Since, Until string
}

// ReasonClasses lists the classes --reason accepts, for its help text.
func ReasonClasses() string { return strings.Join(inbox.DeadLetterClasses, ", ") }

// Filter checks the selection and returns the filter it selects, its times
// taken back from now. An error names the flag it is about.
func (s Selection) Filter(now time.Time) (inbox.DeadLetterFilter, error) {
	for _, r := range s.Reasons {
		if !slices.Contains(inbox.DeadLetterClasses, r) {
			return inbox.DeadLetterFilter{}, fmt.Errorf("--reason %q is not a reason class (one of %s)", r, ReasonClasses())
		}
	}
	if slices.Contains(s.IDs, "") {
		return inbox.DeadLetterFilter{}, fmt.Errorf("--id must not be empty")
	}
	if s.Limit < 0 {
		return inbox.DeadLetterFilter{}, fmt.Errorf("--limit must be 0 (no limit) or more, got %d", s.Limit)
	}
	since, err := parseTime("--since", s.Since, now)
	if err != nil {
		return inbox.DeadLetterFilter{}, err
	}
	until, err := parseTime("--until", s.Until, now)
	if err != nil {
		return inbox.DeadLetterFilter{}, err
	}
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		return inbox.DeadLetterFilter{}, fmt.Errorf("--since (%s) must be before --until (%s)", since.Format(time.RFC3339), until.Format(time.RFC3339))
	}
	return inbox.DeadLetterFilter{Classes: s.Reasons, MessageIDs: s.IDs, Since: since, Until: until, Limit: s.Limit}, nil
}

// parseTime reads an RFC 3339 time or a duration before now; empty is the
// zero time.
func parseTime(name, v string, now time.Time) (time.Time, error) {
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
