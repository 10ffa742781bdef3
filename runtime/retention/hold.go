package retention

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// The runtime writes its progress every ProgressInterval; a replica silent
// for StaleAfter is taken for gone. AnchorSlack covers the round trips
// between a replica's clock and the database's when it converts ages to
// database times (the conversion is off by the difference of two one-way
// latencies).
const (
	ProgressInterval = 5 * time.Second
	StaleAfter       = 6 * ProgressInterval
	AnchorSlack      = 5 * time.Second
)

// Hold is what the consumer's progress allows a prune run to delete.
//
// The window's cutoff (now - window) assumes the consumer acknowledges what
// it committed within maxConsumerOutage. A replica that died between COMMIT
// and ack leaves claims the broker still holds as delivered and never
// acknowledged, and it hands them back whenever a consumer returns, however
// long that takes. So no claim made at or after a replica's anchor is
// deleted while it can still come back: the anchor is the replica's last
// heartbeat, or the start of its oldest claim not yet acknowledged when that
// is earlier. A replica that stopped gracefully had acknowledged everything
// and anchors nothing. A replica gone for StaleAfter is marked stale with
// where the broker's delivery stood then (Settlement.Position); its anchor
// is released once the broker shows that everything delivered up to that
// mark has settled, or that nothing is unsettled at all, so a replica that
// never returns does not hold pruning for ever.
//
// The broker's reading is evidence only about the consumer it was read
// from (see evidenceOf): one created after the replica's claims, or whose
// delivery went back below what the replica claimed or the stamp, proves
// nothing about them by what it has pending; it is stamped with the
// broker's Ceiling instead, and only a floor past that releases the
// replica.
type Hold struct {
	// WindowCutoff is now - window; Cutoff is the earliest anchor when that
	// is earlier, else WindowCutoff.
	WindowCutoff time.Time
	Cutoff       time.Time
	// Reason says why Cutoff is earlier than WindowCutoff; empty when not.
	Reason string
	// Since is when the holding replica's hold began (it went silent, or
	// its oldest unacknowledged claim began).
	Since time.Time
	// Holders names the replicas whose anchors are before WindowCutoff.
	Holders []string
	// Stamp lists the stale replicas to mark, with Marks[replica] (the
	// broker's Position, or its Ceiling when the reading is not of the
	// replica's consumer); Retire the records that hold nothing any more.
	Stamp  []inbox.ProgressRecord
	Marks  map[string]map[string]int64
	Retire []inbox.ProgressRecord
	// Evidence says, per silent replica kept, why the broker's reading did
	// not release it (when it says more than the Facts).
	Evidence map[string]string
}

// Held reports whether the consumer's progress held the cutoff back.
func (h Hold) Held() bool { return h.Cutoff.Before(h.WindowCutoff) }

// HeldFor is how much earlier the cutoff is than the window's.
func (h Hold) HeldFor() time.Duration { return h.WindowCutoff.Sub(h.Cutoff) }

// Bound is the inbox's prune bound for this hold.
func (h Hold) Bound(window time.Duration) inbox.Bound {
	b := inbox.Bound{Window: window}
	if h.Held() {
		b.HoldAt, b.HeldReason, b.HeldSince = h.Cutoff, h.Reason, h.Since
	}
	return b
}

// BoundByProgress applies the rule of Hold to the replicas' progress records
// and the broker's settlement, read at now (the database's clock). When the
// broker could not be read (settleErr), stale replicas keep their anchors:
// nothing proves their claims settled.
func BoundByProgress(now time.Time, window time.Duration, recs []inbox.ProgressRecord, st Settlement, settleErr error) Hold {
	return BoundByReadings(now, window, recs, func(inbox.ProgressRecord) (Settlement, error) { return st, settleErr })
}

// BoundByReadings is BoundByProgress with the broker's settlement read per
// record: reading(r) is the settlement of the consumer r's replica consumed
// from (of a partitioned JetStream source, its partition's durable, which
// the record's consumer identity names), and the error reading it.
func BoundByReadings(now time.Time, window time.Duration, recs []inbox.ProgressRecord, reading func(inbox.ProgressRecord) (Settlement, error)) Hold {
	h := Hold{WindowCutoff: now.Add(-window), Marks: map[string]map[string]int64{}, Evidence: map[string]string{}}
	h.Cutoff = h.WindowCutoff
	var holder *inbox.ProgressRecord
	var stale bool
	for i := range recs {
		r := recs[i]
		silent := now.Sub(r.HeartbeatAt) > StaleAfter
		st, settleErr := reading(r)
		if r.Stopped {
			if silent {
				h.Retire = append(h.Retire, r)
			}
			continue
		}
		if silent && settleErr == nil {
			ev := evidenceOf(r, st)
			if ev.settled {
				h.Retire = append(h.Retire, r)
				continue
			}
			if ev.stamp != nil {
				h.Stamp = append(h.Stamp, r)
				h.Marks[r.Replica] = ev.stamp
			}
			if ev.why != "" {
				h.Evidence[r.Replica] = ev.why
			}
		}
		anchor := anchorOf(r)
		if anchor.Before(h.WindowCutoff) {
			h.Holders = append(h.Holders, r.Replica)
		}
		if anchor.Before(h.Cutoff) {
			h.Cutoff, holder, stale = anchor, &recs[i], silent
		}
	}
	if holder != nil {
		st, settleErr := reading(*holder)
		h.Since, h.Reason = holdReason(now, h, holder, stale, st, settleErr)
	}
	return h
}

// evidence is what a broker reading proves about a gone replica's claims.
type evidence struct {
	settled bool
	// stamp is the mark to record (nil: none to record now).
	stamp map[string]int64
	// why says what keeps the replica held beyond the reading's facts.
	why string
}

// evidenceOf applies the rules:
//   - a reading the broker could not complete (Unknown) proves nothing;
//   - the reading is of the replica's consumer only when it names the
//     one recorded (kind, name, and the creation time where the broker
//     keeps one), or, for a record without one, a consumer not created
//     after the replica started; and when its delivery did not go back
//     below what the replica claimed (Positions) or below the stamp;
//   - of the replica's consumer, nothing unsettled settles it, and a
//     stamp of its delivered Position is waited for;
//   - of another consumer, only a Floor past a stamp of the broker's
//     Ceiling (everything stored when the replica was found gone) does.
func evidenceOf(r inbox.ProgressRecord, st Settlement) evidence {
	if st.Unknown != "" {
		return evidence{why: st.Unknown}
	}
	other := otherConsumer(r, st)
	if r.SettleMark != nil {
		if back := wentBack(st, r.SettleMark, "the mark stamped when the replica was found gone"); back != "" {
			return evidence{why: back}
		}
		if st.Passed(r.SettleMark) && (other == "" || passedStrictly(st, r.SettleMark)) {
			return evidence{settled: true}
		}
		return evidence{why: other}
	}
	if other == "" {
		if st.Unsettled == 0 {
			return evidence{settled: true}
		}
		if st.Consumer.Created == nil && st.Ceiling != nil && !reported(r, st) {
			// Nothing ties this reading to the replica's claims: no
			// creation time, and the replica died before a heartbeat
			// said how far it claimed. A re-created consumer's position
			// could be below them, so the stamp is the Ceiling.
			return evidence{stamp: st.Ceiling}
		}
		return evidence{stamp: st.Position}
	}
	ceiling := st.Ceiling
	if ceiling == nil {
		ceiling = st.Position
	}
	return evidence{stamp: ceiling, why: other}
}

// otherConsumer says why st is not a reading of the consumer r consumed
// from; empty when it is.
func otherConsumer(r inbox.ProgressRecord, st Settlement) string {
	cur := st.Consumer
	switch {
	case cur.Kind == "":
		// A reading that does not name its consumer (tests of old).
	case r.Consumer != nil && !r.Consumer.Same(cur):
		return fmt.Sprintf("the broker's reading is of %s, not of the %s the replica consumed from: a consumer re-created after its claims proves nothing about them by what it has pending; held until its floor passes everything stored when the replica was found gone", cur, r.Consumer)
	case r.Consumer == nil && cur.Created != nil && cur.Created.After(r.StartedAt):
		return fmt.Sprintf("the broker's %s was created after replica %s started (%s): it proves nothing about that replica's claims by what it has pending; held until its floor passes everything stored when the replica was found gone",
			cur, r.Replica, r.StartedAt.UTC().Format(time.RFC3339Nano))
	}
	return wentBack(st, r.Positions, "what the replica claimed")
}

// reported: r's positions cover a monotonic key of st.
func reported(r inbox.ProgressRecord, st Settlement) bool {
	for _, k := range st.Monotonic {
		if _, ok := r.Positions[k]; ok {
			return true
		}
	}
	return false
}

// wentBack says which monotonic key of st's Position is below ref's.
func wentBack(st Settlement, ref map[string]int64, what string) string {
	for _, k := range st.Monotonic {
		want, ok := ref[k]
		if !ok {
			continue
		}
		if got, has := st.Position[k]; has && got < want {
			return fmt.Sprintf("the broker's %s is at %d, below %d, %s: the consumer was re-created or reset (counters or delivery went back), so nothing is proven settled", k, got, want, what)
		}
	}
	return ""
}

// passedStrictly is Passed without its "nothing unsettled" shortcut: a
// consumer that is not the replica's proves only by its floor.
func passedStrictly(st Settlement, mark map[string]int64) bool {
	return Settlement{Unsettled: 1, Floor: st.Floor}.Passed(mark)
}

// anchorOf is the earliest time a claim of r may have begun without having
// been acknowledged, less the slack.
func anchorOf(r inbox.ProgressRecord) time.Time {
	a := r.HeartbeatAt
	if r.UnackedSince != nil && r.UnackedSince.Before(a) {
		a = *r.UnackedSince
	}
	return a.Add(-AnchorSlack)
}

func holdReason(now time.Time, h Hold, r *inbox.ProgressRecord, stale bool, st Settlement, settleErr error) (time.Time, string) {
	var b strings.Builder
	since := r.HeartbeatAt
	switch {
	case stale:
		fmt.Fprintf(&b, "replica %s stopped without acknowledging everything it committed (last progress %s, %s ago)",
			r.Replica, r.HeartbeatAt.UTC().Format(time.RFC3339), FormatDuration(now.Sub(r.HeartbeatAt).Truncate(time.Second)))
	case r.UnackedSince != nil:
		fmt.Fprintf(&b, "replica %s has claims committed but not acknowledged since %s",
			r.Replica, r.UnackedSince.UTC().Format(time.RFC3339))
	default:
		fmt.Fprintf(&b, "replica %s is running (last progress %s) and the window is shorter than its progress interval and slack (%s)",
			r.Replica, r.HeartbeatAt.UTC().Format(time.RFC3339), FormatDuration(ProgressInterval+AnchorSlack))
	}
	if r.UnackedSince != nil && r.UnackedSince.Before(since) {
		since = *r.UnackedSince
	}
	if len(r.Positions) > 0 {
		fmt.Fprintf(&b, "; it claimed up to %s", formatPositions(r.Positions))
	}
	switch {
	case settleErr != nil:
		fmt.Fprintf(&b, "; the broker could not be read to prove those claims settled (%v)", settleErr)
	case st.Facts != "":
		fmt.Fprintf(&b, "; the broker may still redeliver them (%s)", st.Facts)
	}
	if why := h.Evidence[r.Replica]; why != "" && stale {
		fmt.Fprintf(&b, "; %s", why)
	}
	fmt.Fprintf(&b, "; ids claimed since %s are kept (the window alone would delete up to %s, %s later)",
		h.Cutoff.UTC().Format(time.RFC3339), h.WindowCutoff.UTC().Format(time.RFC3339), FormatDuration(h.HeldFor().Truncate(time.Second)))
	if n := len(h.Holders); n > 1 {
		fmt.Fprintf(&b, "; %d replicas hold pruning back", n)
	}
	return since, b.String()
}

func formatPositions(p map[string]int64) string {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s@%d", k, p[k])
	}
	return strings.Join(parts, ",")
}
