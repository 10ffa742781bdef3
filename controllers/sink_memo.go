package controllers

import (
	"context"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
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

// The sink memo (the last sinkSnapshot, kept in the reconciler's memory)
// spares the sink database the checks of a pass that a child's
// change woke: a Deployment's status moving (a pod ready, a node drained)
// wakes its owner, and with 1,000 consumers on one database each wake cost
// the inbox's up-to-date query, the effect's catalog checks and the
// window's row lock. A healthy sink is checked when the generation, the
// rendered config or the Secret data change (the window also on a new
// broker reading), and otherwise once per --recheck-period, so a DROP or
// REVOKE behind the controller's back is seen by the next pass after it (a
// running runtime sees a lost inbox within 5 s and its readiness wakes the
// pass). A pass is never spared while the consumer
// Deployment is not available, nor after a read of the runtime's records
// failed (distrustSink). A check that failed or did not complete is
// never reused, so a sink that is not ready is still checked on every pass
// (and within --recheck-period). The runtime's records (the last prune run,
// id conflicts, the outbox) are read on every pass: they are what a Job's
// or a pod's change comes to report.

// freshSnapshot returns owner's snapshot for key taken less than ttl
// before now.
func freshSnapshot(m *memory, owner types.NamespacedName, key string, now time.Time, ttl time.Duration) (sinkSnapshot, bool) {
	snap, ok := m.sinkSnapshot(owner)
	if !ok || snap.key != key || now.Sub(snap.at) >= ttl || now.Before(snap.at) {
		return sinkSnapshot{}, false
	}
	return snap, true
}

// sinkMemoKey is what a reused check must have run with: the object (a
// resource deleted and created again under its name is another), its
// generation, the rendered config and the referenced Secrets' data.
func sinkMemoKey(s *scope) string {
	return string(s.idc.UID) + "/" + strconv.FormatInt(s.idc.Generation, 10) + "/" + s.rc.Hash + "/" + s.secrets.hash
}

// reuseSink looks the pass's snapshot up once (in the inbox phase, the
// first of the sink phases): s.reused is set on a hit, s.recording
// otherwise.
// A consumer Deployment that is not available (pods failing against a
// dropped inbox or a revoked grant, say) is never a reason to reuse: its
// change is what woke the pass.
func (r *Reconciler) reuseSink(ctx context.Context, s *scope) {
	key := sinkMemoKey(s)
	if snap, ok := freshSnapshot(r.memory, s.key, key, r.opts.Clock.Now(), r.opts.RecheckPeriod); ok && r.consumersAvailable(ctx, s) {
		s.reused = &snap
		return
	}
	s.recording = &sinkSnapshot{key: key, at: r.opts.Clock.Now()}
}

// consumersAvailable reads the consumer Deployments (one per partition)
// from the cache: they exist and are available.
func (r *Reconciler) consumersAvailable(ctx context.Context, s *scope) bool {
	for _, w := range specs.Workloads(s.idc) {
		var d appsv1.Deployment
		if err := r.client.Get(ctx, types.NamespacedName{Namespace: s.idc.Namespace, Name: w.Name}, &d); err != nil {
			return false
		}
		if ok, _ := deploymentAvailable(&d); !ok {
			return false
		}
	}
	return true
}

// recordSink keeps the pass's snapshot when every sink check recorded a
// fresh, successful result, aged from the broker reading it used when that
// is older (so the periodic pass, due a period after the reading, always
// checks afresh); a check that failed or did not complete drops what was
// kept.
func (r *Reconciler) recordSink(s *scope) {
	switch {
	case s.recording == nil:
	case s.recording.done != sinkAll:
		r.memory.dropSinkSnapshot(s.key)
	default:
		if s.reading != nil && s.reading.at.Before(s.recording.at) {
			s.recording.at = s.reading.at
		}
		// The config as the pass left it: the inbox phase may have given it
		// the inbox's epoch.
		s.recording.key = sinkMemoKey(s)
		r.memory.putSinkSnapshot(s.key, *s.recording)
	}
}

// distrustSink drops the kept check and records none in this pass: a read
// of the runtime's records failed, so the sink itself is checked again on
// the next pass.
func (r *Reconciler) distrustSink(s *scope) {
	r.memory.dropSinkSnapshot(s.key)
	s.recording = nil
}
