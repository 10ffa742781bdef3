package retention

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

func TestBoundByProgress(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	window := time.Minute
	at := func(ago time.Duration) time.Time { return now.Add(-ago) }
	ptr := func(t time.Time) *time.Time { return &t }
	live := inbox.ProgressRecord{Replica: "live", HeartbeatAt: at(2 * time.Second)}
	stopped := inbox.ProgressRecord{Replica: "stopped", HeartbeatAt: at(time.Hour), Stopped: true}
	crashed := inbox.ProgressRecord{Replica: "crashed", HeartbeatAt: at(10 * time.Minute), Positions: map[string]int64{"S": 200}}
	crashedMarked := crashed
	crashedMarked.SettleMark = map[string]int64{"stream": 200}
	unsettled := Settlement{Unsettled: 200, Position: map[string]int64{"stream": 200}, Floor: map[string]int64{"stream": 0}, Facts: "ack pending 200"}
	settledPast := Settlement{Unsettled: 3, Position: map[string]int64{"stream": 260}, Floor: map[string]int64{"stream": 250}}
	cases := []struct {
		name       string
		recs       []inbox.ProgressRecord
		st         Settlement
		stErr      error
		wantCutoff time.Time
		stamp      []string
		retire     []string
		reason     []string
	}{
		{name: "no records: the window alone", wantCutoff: at(window)},
		{name: "live and stopped replicas: the window alone", recs: []inbox.ProgressRecord{live, stopped}, st: unsettled,
			wantCutoff: at(window), retire: []string{"stopped"}},
		{name: "a crashed replica with unsettled claims holds at its last heartbeat", recs: []inbox.ProgressRecord{crashed, live}, st: unsettled,
			wantCutoff: crashed.HeartbeatAt.Add(-AnchorSlack), stamp: []string{"crashed"},
			reason: []string{"replica crashed stopped without acknowledging", "S@200", "ack pending 200"}},
		{name: "an oldest unacknowledged claim before the heartbeat anchors earlier",
			recs: []inbox.ProgressRecord{{Replica: "c", HeartbeatAt: at(5 * time.Minute), UnackedSince: ptr(at(7 * time.Minute))}}, st: unsettled,
			wantCutoff: at(7*time.Minute + AnchorSlack), stamp: []string{"c"}},
		{name: "a marked replica keeps holding until the floor passes its mark", recs: []inbox.ProgressRecord{crashedMarked}, st: unsettled,
			wantCutoff: crashed.HeartbeatAt.Add(-AnchorSlack)},
		{name: "a marked replica whose mark the floor passed is retired", recs: []inbox.ProgressRecord{crashedMarked}, st: settledPast,
			wantCutoff: at(window), retire: []string{"crashed"}},
		{name: "nothing unsettled retires a crashed replica at once", recs: []inbox.ProgressRecord{crashed}, st: Settlement{},
			wantCutoff: at(window), retire: []string{"crashed"}},
		{name: "a broker that cannot be read keeps the hold", recs: []inbox.ProgressRecord{crashedMarked}, stErr: errors.New("connection refused"),
			wantCutoff: crashed.HeartbeatAt.Add(-AnchorSlack), reason: []string{"could not be read", "connection refused"}},
		{name: "a live replica with an old unacknowledged claim holds too",
			recs: []inbox.ProgressRecord{{Replica: "slow", HeartbeatAt: at(time.Second), UnackedSince: ptr(at(3 * time.Minute))}}, st: unsettled,
			wantCutoff: at(3*time.Minute + AnchorSlack), reason: []string{"committed but not acknowledged since"}},
		{name: "a crash older than the hold is irrelevant when recent enough",
			recs: []inbox.ProgressRecord{{Replica: "recent", HeartbeatAt: at(40 * time.Second)}}, st: unsettled,
			wantCutoff: at(window), stamp: []string{"recent"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := BoundByProgress(now, window, tc.recs, tc.st, tc.stErr)
			if !h.Cutoff.Equal(tc.wantCutoff) {
				t.Errorf("cutoff %s, want %s (reason %q)", h.Cutoff, tc.wantCutoff, h.Reason)
			}
			if !h.WindowCutoff.Equal(at(window)) {
				t.Errorf("window cutoff %s", h.WindowCutoff)
			}
			if h.Held() != h.Cutoff.Before(at(window)) || h.Held() != (h.Reason != "") {
				t.Errorf("held %v with reason %q", h.Held(), h.Reason)
			}
			if got := names(h.Stamp); strings.Join(got, ",") != strings.Join(tc.stamp, ",") {
				t.Errorf("stamp %v, want %v", got, tc.stamp)
			}
			if got := names(h.Retire); strings.Join(got, ",") != strings.Join(tc.retire, ",") {
				t.Errorf("retire %v, want %v", got, tc.retire)
			}
			for _, r := range tc.reason {
				if !strings.Contains(h.Reason, r) {
					t.Errorf("reason %q lacks %q", h.Reason, r)
				}
			}
			b := h.Bound(window)
			if b.Window != window || b.HoldAt.IsZero() == h.Held() {
				t.Errorf("bound %+v for held=%v", b, h.Held())
			}
		})
	}
}

func names(recs []inbox.ProgressRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Replica
	}
	return out
}
