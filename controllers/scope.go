package controllers

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// setScale records the desired replicas and why in the status.
func (s *scope) setScale(desired int32, why string) {
	if s.idc.Status.Runtime == nil {
		return
	}
	s.idc.Status.Runtime.DesiredReplicas = &desired
	s.idc.Status.Runtime.ScaleReason = why
}

// scope is everything one reconcile pass of one resource knows: the
// resource as read and the copy its status is projected into, its rendered
// config and Secrets, what the broker reported, the window in force and
// what each phase observed. Phases read and add to it; nothing else is
// threaded between them.
type scope struct {
	// before is the resource as read; idc is the copy the phases write
	// status into.
	before, idc *messagingv1alpha1.IdempotentConsumer
	key         types.NamespacedName
	rc          *renderedConfig
	secrets     *resolvedSecrets
	// reading is the broker reading in force (fresh or reused), in
	// Explicit mode too (its window from the spec, its lag from the
	// broker); nil only before the broker phase has run.
	reading *brokerReading
	// window is the retention window in force; 0 while unresolved.
	window time.Duration
	obs    observation
	halted bool
	// kedaInstalled: KEDA's API is served (asked only for a resource that
	// autoscales).
	kedaInstalled bool
	// liveReplicas is the consumer Deployment's spec.replicas as read
	// back, whoever set it.
	liveReplicas int32
	// reused is the sink checks' snapshot this pass reuses (the sink memo);
	// recording is the one it takes instead. At most one is set.
	reused, recording *sinkSnapshot
	// claim is what the resource claims of its inbox (ownerClaim), set by
	// the inbox phase.
	claim inbox.OwnerClaim
}

func newScope(idc *messagingv1alpha1.IdempotentConsumer) *scope {
	return &scope{before: idc.DeepCopy(), idc: idc, key: client.ObjectKeyFromObject(idc)}
}

// target is the resource's sink database for the sinkdb client.
func (s *scope) target() sinkdb.Target {
	return sinkdb.Target{Owner: s.key.String(), DSN: s.secrets.getenv(s.rc.Config.Sink.DSNEnv), Sink: s.rc.Config.Sink, Outbox: s.rc.Config.UsesOutbox(), Claim: s.claim}
}

// halt ends the pass after the current phase: what it observed explains
// why, and the phases after it are not reached.
func (s *scope) halt() { s.halted = true }

// stall ends the pass with Stalled=True: a person must act.
func (s *scope) stall(reason, message string) {
	s.obs.stalled = failed(reason, message)
	s.halt()
}
