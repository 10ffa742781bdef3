package controllers

import (
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// sinkSnapshot is what the sink checks (the inbox, effect and retention
// phases) observed in one pass in which each of them succeeded: the status
// fields and outcomes they set.
type sinkSnapshot struct {
	// key is the resource's generation, rendered config and Secret data
	// the checks ran with; at is when they ran.
	key string
	at  time.Time
	// readingAt is the broker reading the window was adopted from: the
	// window is reused only while the same reading is in force.
	readingAt time.Time

	inbox        *messagingv1alpha1.InboxStatus
	inboxObs     outcome
	effectObs    outcome
	retention    *messagingv1alpha1.RetentionStatus
	retentionObs outcome
	window       time.Duration

	// done marks each check whose fresh, successful result is recorded;
	// only a snapshot with every bit is kept.
	done uint8
}

const (
	sinkInbox uint8 = 1 << iota
	sinkEffect
	sinkRetention
	sinkAll = sinkInbox | sinkEffect | sinkRetention
)

// sinkMemo spares the sink database the checks of a pass that a child's
// change woke: a Deployment's status moving (a pod ready, a node drained)
// wakes its owner, and with 1,000 consumers on one database each wake cost
// the inbox's up-to-date query, the effect's catalog checks and the
// window's row lock. A healthy sink is checked when the generation, the
// rendered config or the Secret data change, when the broker is read again,
// and otherwise once per --retention-period (the periodic pass): as often
// as without child events. A check that failed or did not complete is
// never reused, so a sink that is not ready is still checked on every pass
// (and within --recheck-period). The runtime's records (the last prune run,
// id conflicts, the outbox) are read on every pass: they are what a Job's
// or a pod's change comes to report.
type sinkMemo struct {
	mu sync.Mutex
	m  map[types.NamespacedName]sinkSnapshot
}

func newSinkMemo() *sinkMemo { return &sinkMemo{m: map[types.NamespacedName]sinkSnapshot{}} }

// fresh returns the snapshot for key taken less than ttl before now.
func (m *sinkMemo) fresh(owner types.NamespacedName, key string, now time.Time, ttl time.Duration) (sinkSnapshot, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	snap, ok := m.m[owner]
	if !ok || snap.key != key || now.Sub(snap.at) >= ttl || now.Before(snap.at) {
		return sinkSnapshot{}, false
	}
	return snap, true
}

func (m *sinkMemo) put(owner types.NamespacedName, snap sinkSnapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.m[owner] = snap
}

func (m *sinkMemo) forget(owner types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, owner)
}

// sinkMemoKey is what a reused check must have run with: the generation,
// the rendered config and the referenced Secrets' data.
func sinkMemoKey(s *scope) string {
	return strconv.FormatInt(s.idc.Generation, 10) + "/" + s.rc.Hash + "/" + s.secrets.hash
}

// reuseSink looks the pass's snapshot up once (in the inbox phase, the
// first of the sink phases): s.reused is set on a hit, s.recording
// otherwise.
func (r *Reconciler) reuseSink(s *scope) {
	key := sinkMemoKey(s)
	if snap, ok := r.sinkMemo.fresh(s.key, key, r.opts.Clock.Now(), max(r.opts.RetentionPeriod, r.opts.RecheckPeriod)); ok {
		s.reused = &snap
		return
	}
	s.recording = &sinkSnapshot{key: key, at: r.opts.Clock.Now()}
}

// recordSink keeps the pass's snapshot when every sink check recorded a
// fresh, successful result.
func (r *Reconciler) recordSink(s *scope) {
	if s.recording != nil && s.recording.done == sinkAll {
		r.sinkMemo.put(s.key, *s.recording)
	}
}
