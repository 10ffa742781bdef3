package controllers

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// DefaultRecheckPeriod is how often a resource whose sink, inbox or broker
// is not ready is checked again (--recheck-period): a migration that
// creates the table, a GRANT or a database that is back is picked up
// within it without anyone touching the resource.
const DefaultRecheckPeriod = 20 * time.Second

// needsHuman says whether a sink fault is one only a person can fix (a
// privilege, a table, column or unique key that is missing, a statement,
// connection string or credentials that are wrong): it sets Stalled=True, which kstatus
// reads as Failed and the Argo CD health check as Degraded. A database
// that cannot be reached, or a provisioning error of another kind, is
// transient: the resource stays Reconciling and is re-checked.
func needsHuman(reason string) bool {
	switch reason {
	case messagingv1alpha1.ReasonPermissionDenied, messagingv1alpha1.ReasonInvalidDSN, messagingv1alpha1.ReasonAuthenticationFailed,
		messagingv1alpha1.ReasonTableNotFound, messagingv1alpha1.ReasonColumnNotFound,
		messagingv1alpha1.ReasonColumnTypeMismatch, messagingv1alpha1.ReasonNoUniqueKey,
		messagingv1alpha1.ReasonStatementInvalid, messagingv1alpha1.ReasonInboxLost:
		return true
	}
	return false
}

// sinkFault records a sink that is not ready in outcome *o (and in Stalled
// when only a person can fix it), logs it, and asks for a re-check within
// RecheckPeriod instead of failing the pass: controller-runtime's per-item
// backoff would grow to minutes, and a fixed grant would wait that long.
func (r *Reconciler) sinkFault(ctx context.Context, s *scope, o *outcome, reason, msg string) ctrl.Result {
	*o = failed(reason, msg)
	if needsHuman(reason) {
		s.obs.stalled = failed(reason, msg)
	}
	res := r.recheck()
	log.FromContext(ctx).Info("sink not ready; checking again", "reason", reason, "message", msg, "stalled", needsHuman(reason), "recheckAfter", res.RequeueAfter)
	return res
}

// Provisioner creates and drops a resource's inbox tables and lets go of
// its connections.
type Provisioner interface {
	// Ensure creates the schema and tables idempotently, records the
	// resource as the inbox's owner and returns the schema version and the
	// inbox's identity; *inbox.OwnedError and *inbox.LostError refuse.
	Ensure(ctx context.Context, t sinkdb.Target) (sinkdb.Ensured, error)
	// MarkRestored marks the inbox of epoch lost: it is older than the
	// resource's record of it.
	MarkRestored(ctx context.Context, t sinkdb.Target, epoch string) error
	// Drop drops the tables of an inbox the resource owns; dropping what
	// is gone succeeds.
	Drop(ctx context.Context, t sinkdb.Target) error
	// Release lets go of the connections an owner used.
	Release(owner string)
}

// Preflight checks, read-only, that the sink can take the effect: nil, a
// *sinkdb.EffectProblem, or an error when the check could not run.
type Preflight interface {
	CheckEffect(ctx context.Context, t sinkdb.Target, cfg *config.Config) error
}

// WindowStore keeps the window state beside the inbox (see
// retention.AdoptStored).
type WindowStore interface {
	AdoptWindow(ctx context.Context, t sinkdb.Target, derived retention.Result, now time.Time) (applied retention.Applied, pendingShrink bool, err error)
	StoredWindow(ctx context.Context, t sinkdb.Target) (*retention.Applied, error)
}

// RecordReader reads what the runtime and its jobs recorded in the inbox.
type RecordReader interface {
	LastPrune(ctx context.Context, t sinkdb.Target) (*inbox.PruneRun, error)
	OutboxStats(ctx context.Context, t sinkdb.Target) (inbox.OutboxStats, error)
	IDConflicts(ctx context.Context, t sinkdb.Target) (int64, error)
	RedriveSummary(ctx context.Context, t sinkdb.Target, run string) (inbox.RedriveSummary, error)
}

// SinkDB is the sink database as the reconciler uses it; *sinkdb.Client
// implements it, the unit tests a fake.
type SinkDB interface {
	Provisioner
	Preflight
	WindowStore
	RecordReader
}

var _ SinkDB = (*sinkdb.Client)(nil)

// classifyDBError is sinkdb.Classify for the resource's connection Secret.
func classifyDBError(idc *messagingv1alpha1.IdempotentConsumer, err error) (string, string) {
	return sinkdb.Classify(err, idc.Spec.Sink.ConnectionSecretRef())
}
