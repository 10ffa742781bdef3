package integration

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// retiredMsg is the line `idc-runtime prune` logs when the broker's reading
// proves that a gone replica's deliveries settled (cmd/idc-runtime/prune.go).
const retiredMsg = "The broker settled everything a gone replica could have claimed; it no longer holds pruning back"

// settledOnEvidence reports whether a prune run's output retired every one
// of replicas on the broker's reading, and returns the readings it logged.
func settledOnEvidence(output string, replicas []string) ([]string, bool) {
	if len(replicas) == 0 {
		return nil, false
	}
	settled := map[string]string{}
	for _, line := range strings.Split(output, "\n") {
		var l struct {
			Msg     string `json:"msg"`
			Replica string `json:"progressReplica"`
			Broker  string `json:"broker"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == retiredMsg {
			settled[l.Replica] = l.Broker
		}
	}
	var facts []string
	for _, r := range replicas {
		f, ok := settled[r]
		if !ok {
			return nil, false
		}
		facts = append(facts, r+": "+f)
	}
	return facts, true
}

// unstoppedReplicas are the replicas whose progress records say they did
// not stop gracefully.
func unstoppedReplicas(t *testing.T, store sink.Inbox) []string {
	t.Helper()
	_, recs, err := store.Progress(context.Background())
	if err != nil {
		t.Fatalf("reading the progress records: %v", err)
	}
	var out []string
	for _, r := range recs {
		if !r.Stopped {
			out = append(out, r.Replica)
		}
	}
	return out
}

func containsAny(have, want []string) bool {
	for _, w := range want {
		if slices.Contains(have, w) {
			return true
		}
	}
	return false
}

// logProgressRows logs the progress records as a prune run reads them.
func logProgressRows(t *testing.T, label string, store sink.Inbox) {
	t.Helper()
	now, recs, err := store.Progress(context.Background())
	if err != nil {
		t.Fatalf("reading the progress records: %v", err)
	}
	t.Logf("%s (database clock %s): %d", label, now.UTC().Format(time.RFC3339Nano), len(recs))
	for _, r := range recs {
		unacked, stale := "-", "-"
		if r.UnackedSince != nil {
			unacked = r.UnackedSince.UTC().Format(time.RFC3339Nano)
		}
		if r.StaleSince != nil {
			stale = r.StaleSince.UTC().Format(time.RFC3339Nano)
		}
		t.Logf("  %s: heartbeat %s ago, unacked_since %s, stopped %t, stale_since %s, settle_mark %v",
			r.Replica, now.Sub(r.HeartbeatAt).Truncate(time.Millisecond), unacked, r.Stopped, stale, r.SettleMark)
	}
}
