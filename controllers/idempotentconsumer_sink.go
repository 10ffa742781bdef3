package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
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
	return sinkdb.Classify(err, idc.Spec.Sink.Postgres.ConnectionSecretRef)
}

// inboxPhase provisions the inbox and records the resource as its owner.
// A failure halts the pass (nothing after it can run without the inbox)
// and is checked again within RecheckPeriod; a privilege or connection
// string only a person can fix also stalls it, and so do an inbox another
// resource owns (Conflict) and a lost one (InboxLost).
func (r *Reconciler) inboxPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	claim, err := r.ownerClaim(ctx, s.idc)
	if err != nil {
		return ctrl.Result{}, err
	}
	s.claim = claim
	r.reuseSink(ctx, s)
	if snap := s.reused; snap != nil {
		s.idc.Status.Inbox = snap.inbox.DeepCopy()
		s.obs.inbox = snap.inboxObs
		return ctrl.Result{}, nil
	}
	ens, err := r.opts.Sink.Ensure(ctx, s.target())
	var owned *inbox.OwnedError
	var lost *inbox.LostError
	switch {
	case errors.As(err, &owned):
		msg := ownedMessage(owned)
		s.obs.inbox = failed(messagingv1alpha1.ReasonConflict, msg)
		s.stall(messagingv1alpha1.ReasonConflict, msg)
		return ctrl.Result{}, nil
	case errors.As(err, &lost):
		setInboxLost(s.idc, true)
		msg := lostMessage(s.idc.Name, lost)
		s.halt()
		return r.sinkFault(ctx, s, &s.obs.inbox, messagingv1alpha1.ReasonInboxLost, msg), nil
	case err != nil:
		reason, msg := classifyDBError(s.idc, err)
		var named *sinkdb.EffectProblem
		if reason == messagingv1alpha1.ReasonPermissionDenied && !errors.As(err, &named) {
			// A refusal the sink client could not narrow down to one grant
			// (explainInboxPrivilege names it when it can).
			msg += fmt.Sprintf(" (GRANT USAGE, CREATE ON SCHEMA %s TO the role)", pgx.Identifier{s.rc.Config.Sink.Schema}.Sanitize())
		}
		s.halt()
		return r.sinkFault(ctx, s, &s.obs.inbox, reason, msg), nil
	}
	setInboxLost(s.idc, false)
	r.inboxEvents(s, ens)
	if err := s.rc.withEpoch(ens.Identity.Epoch); err != nil {
		return ctrl.Result{}, err
	}
	s.idc.Status.Inbox = inboxStatusFor(s.rc.Config, ens)
	s.obs.inbox = okOutcome(messagingv1alpha1.ReasonProvisioned,
		fmt.Sprintf("inbox %s (layout %s, schema version %d, epoch %s) and its dead-letter and prune-run tables exist, owned by this resource", s.idc.Status.Inbox.Table, s.rc.Config.Sink.Layout, ens.Version, ens.Identity.Epoch))
	if s.recording != nil {
		s.recording.inbox, s.recording.inboxObs = s.idc.Status.Inbox.DeepCopy(), s.obs.inbox
		s.recording.done |= sinkInbox
	}
	return ctrl.Result{}, nil
}

// inboxEvents says what a person's annotation, or a restore, made the
// migration do.
func (r *Reconciler) inboxEvents(s *scope, ens sinkdb.Ensured) {
	if !ens.Migrated {
		return
	}
	table := s.rc.Config.Sink.Schema + "." + s.rc.Config.Sink.InboxTable
	if s.claim.AcceptLoss {
		r.recorder.Eventf(s.idc, nil, corev1.EventTypeWarning, messagingv1alpha1.ReasonInboxLossAccepted, "AcceptInboxLoss",
			"accepted the loss of inbox %s epoch %s (annotation %s); it continues as epoch %s: messages from before the loss may be applied again",
			table, s.claim.Epoch, messagingv1alpha1.AnnotationAcceptInboxLoss, ens.Identity.Epoch)
	}
	if ens.Adopted {
		r.recorder.Eventf(s.idc, nil, corev1.EventTypeNormal, messagingv1alpha1.ReasonInboxAdopted, "AdoptInbox",
			"took over inbox %s (epoch %s, its claims kept), recorded for %s", table, ens.Identity.Epoch, ens.Previous)
	}
}

// inboxStatusFor is status.inbox for a provisioned inbox.
func inboxStatusFor(cfg *config.Config, ens sinkdb.Ensured) *messagingv1alpha1.InboxStatus {
	return &messagingv1alpha1.InboxStatus{
		Table:         cfg.Sink.Schema + "." + cfg.Sink.InboxTable,
		Layout:        messagingv1alpha1.InboxLayout(cfg.Sink.Layout),
		SchemaVersion: int32(ens.Version),
		Epoch:         ens.Identity.Epoch,
		Database:      ens.Identity.Database,
	}
}

// effectPhase runs the preflight. A problem makes EffectReady False and
// Stalled True (a person must fix the sink), holds the Deployment at 0
// replicas (childrenPhase) and asks for a re-check within RecheckPeriod. A
// check that could not run (the database is unreachable) halts the pass,
// leaving the Deployment as it is, and is checked again too.
func (r *Reconciler) effectPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	if s.reused != nil {
		s.obs.effect = s.reused.effectObs
		return ctrl.Result{}, nil
	}
	err := r.opts.Sink.CheckEffect(ctx, s.target(), s.rc.Config)
	var p *sinkdb.EffectProblem
	switch {
	case err == nil:
		s.obs.effect = okOutcome(messagingv1alpha1.ReasonReady, effectReadyMessage(s.rc.Config))
		if s.recording != nil {
			s.recording.effectObs = s.obs.effect
			s.recording.done |= sinkEffect
		}
		return ctrl.Result{}, nil
	case errors.As(err, &p):
		return r.sinkFault(ctx, s, &s.obs.effect, p.Reason, p.Message), nil
	default:
		reason, msg := classifyDBError(s.idc, err)
		s.halt()
		return r.sinkFault(ctx, s, &s.obs.effect, reason, msg), nil
	}
}

func effectReadyMessage(cfg *config.Config) string {
	e := cfg.Sink.Effect
	switch {
	case e.Upsert != nil:
		return fmt.Sprintf("table %s.%s has every mapped column, a unique key on (%s) and the privileges the upsert needs", cfg.Sink.Schema, e.Upsert.Table, strings.Join(e.Upsert.Key, ", "))
	case e.Append != nil:
		return fmt.Sprintf("table %s.%s has every mapped column and the privileges the append needs", cfg.Sink.Schema, e.Append.Table)
	case e.SQL != nil:
		return "the sql statement prepares with its declared parameters and the role may run it"
	}
	return "the http effect has nothing to check in the sink database"
}

// validateSQLParams: the statement's :name parameters and spec params must
// match both ways. CEL cannot parse SQL, so the controller checks it and
// stalls with InvalidSpec.
func validateSQLParams(cfg *config.Config) error {
	s := cfg.Sink.Effect.SQL
	if s == nil {
		return nil
	}
	_, names, err := effect.ConvertNamedParams(s.Statement)
	if err != nil {
		return fmt.Errorf("spec.sink.effect.sql.statement: %w", err)
	}
	params := make([]string, 0, len(s.Params))
	for k := range s.Params {
		params = append(params, k)
	}
	sort.Strings(params)
	for _, n := range names {
		if _, ok := s.Params[n]; !ok {
			return fmt.Errorf("spec.sink.effect.sql.statement uses :%s, which is not in spec.sink.effect.sql.params (%s)", n, strings.Join(params, ", "))
		}
	}
	for _, n := range params {
		if !slices.Contains(names, n) {
			return fmt.Errorf("spec.sink.effect.sql.params.%s is not used by the statement (no :%s in spec.sink.effect.sql.statement)", n, n)
		}
	}
	return nil
}
