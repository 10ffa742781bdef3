package effect

import "sort"

// Keyed is one valid record of an upsert batch: its entity key (the key
// columns' text, NUL-separated), its sequence and its index in the batch.
type Keyed struct {
	Key   string
	Seq   int64
	Index int
}

// Collapse keeps one record per key, the rule every dialect's upsert
// applies before it writes: without a sequence (sequenced false) the later
// record wins; with one, the higher sequence wins and a tie keeps the
// earlier record. The winners come back sorted by key, the order every
// transaction writes in, so two upserting overlapping keys cannot deadlock.
// (The PostgreSQL upsert applies the same rule inline, over its arena of
// JSON rows, so as not to allocate the Keyed slice.)
func Collapse(recs []Keyed, sequenced bool) []Keyed {
	at := make(map[string]int, len(recs))
	out := make([]Keyed, 0, len(recs))
	for _, r := range recs {
		i, seen := at[r.Key]
		switch {
		case !seen:
			at[r.Key] = len(out)
			out = append(out, r)
		case !sequenced || r.Seq > out[i].Seq:
			out[i] = r
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Key < out[b].Key })
	return out
}
