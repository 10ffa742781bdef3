package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DeadLetterListing is the dead letters a filter selects, as an operator
// reads them (`idc-runtime deadletters`, `kubectl idc deadletters`): no
// payload and no headers, each reason cut to an excerpt.
type DeadLetterListing struct {
	// Total counts every row the filter selects, before the limit.
	Total int64 `json:"total"`
	// DeadLetters are the rows within the limit, oldest first.
	DeadLetters []DeadLetterSummary `json:"deadLetters"`
}

// DeadLetterSummary is one dead letter without its payload.
type DeadLetterSummary struct {
	ID        int64  `json:"id"`
	MessageID string `json:"messageId,omitempty"`
	NativeID  string `json:"nativeId,omitempty"`
	// ReasonClass is the bounded class (DeadLetterClasses).
	ReasonClass string `json:"reasonClass"`
	// Reason is the first excerpt runes of the error.
	Reason string `json:"reason"`
	// ReasonTruncated says the reason was longer than the excerpt.
	ReasonTruncated bool      `json:"reasonTruncated,omitempty"`
	Attempts        int       `json:"attempts"`
	DeadAt          time.Time `json:"deadAt"`
	// PublishedAt is the broker's publish time, when it told one.
	PublishedAt *time.Time `json:"publishedAt,omitempty"`
}

// ListDeadLetters returns the dead letters the filter selects, oldest first,
// with every reason cut to excerpt runes (excerpt > 0).
func (s *Store) ListDeadLetters(ctx context.Context, q Querier, f DeadLetterFilter, excerpt int) (DeadLetterListing, error) {
	if excerpt <= 0 {
		return DeadLetterListing{}, fmt.Errorf("the reason excerpt must be positive, got %d", excerpt)
	}
	// A limit bounds the rows, never the total: count(*) OVER () is taken
	// before LIMIT.
	args := append(deadLetterFilterArgs(f), excerpt)
	rows, err := q.Query(ctx, `SELECT id, coalesce(message_id, ''), coalesce(native_id, ''), `+reasonClassSQL+`,
			left(reason, $6), char_length(reason) > $6, coalesce(attempts, 0), dead_at, published_at,
			count(*) OVER ()
		FROM `+s.deadLetters+` WHERE `+deadLetterFilterSQL+`
		ORDER BY id LIMIT $5`, args...)
	if err != nil {
		return DeadLetterListing{}, fmt.Errorf("while listing dead letters: %w", err)
	}
	out := DeadLetterListing{DeadLetters: []DeadLetterSummary{}}
	var d DeadLetterSummary
	var published *time.Time
	_, err = pgx.ForEachRow(rows, []any{&d.ID, &d.MessageID, &d.NativeID, &d.ReasonClass, &d.Reason, &d.ReasonTruncated,
		&d.Attempts, &d.DeadAt, &published, &out.Total}, func() error {
		d.PublishedAt = nil
		if published != nil {
			t := *published
			d.PublishedAt = &t
		}
		out.DeadLetters = append(out.DeadLetters, d)
		return nil
	})
	if err != nil {
		return DeadLetterListing{}, fmt.Errorf("while listing dead letters: %w", err)
	}
	return out, nil
}

// ReasonClassSQL is the class expression of a dead-letter row (see
// reasonClassSQL) for the other dialects: its text is valid MySQL too.
const ReasonClassSQL = reasonClassSQL
