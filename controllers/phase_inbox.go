package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// The inbox's owner and epoch live in the database (runtime/inbox,
// identity.go): this file turns a resource into the claim the sink client
// makes, and the refusals into conditions a person can act on.

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get,resourceNames=kube-system

// unknownCluster is the cluster identity of a manager that may not read
// the kube-system namespace and has no --cluster-id.
const unknownCluster = "unknown"

// clusterIdentity is the cluster's identity in an inbox's owner record:
// the kube-system namespace's UID, read once (Options.ClusterID overrides
// it).
type clusterIdentity struct {
	mu sync.Mutex
	id string
}

func (r *Reconciler) clusterID(ctx context.Context) (string, error) {
	r.cluster.mu.Lock()
	defer r.cluster.mu.Unlock()
	if r.cluster.id != "" {
		return r.cluster.id, nil
	}
	if r.opts.ClusterID != "" {
		r.cluster.id = r.opts.ClusterID
		return r.cluster.id, nil
	}
	var ns corev1.Namespace
	err := r.live.Get(ctx, types.NamespacedName{Name: "kube-system"}, &ns)
	switch {
	case apierrors.IsForbidden(err):
		// A namespaced install (--watch-namespaces, the chart's
		// watchNamespaces) has no cluster-wide read: owners then record
		// the cluster as unknownCluster, and two such clusters on one
		// database tell their resources apart by namespace/name only.
		log.FromContext(ctx).Info("Cannot read the kube-system namespace; inbox owners record the cluster as "+unknownCluster+" (set --cluster-id to tell clusters sharing a database apart)", "error", err.Error())
		r.cluster.id = unknownCluster
	case err != nil:
		return "", fmt.Errorf("reading the cluster's identity (the kube-system namespace's UID; --cluster-id sets it instead): %w", err)
	default:
		r.cluster.id = string(ns.UID)
	}
	return r.cluster.id, nil
}

// ownerClaim is what the resource claims of its inbox: itself as owner,
// the epoch it knows, and what a person accepted by annotation.
func (r *Reconciler) ownerClaim(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer) (inbox.OwnerClaim, error) {
	cluster, err := r.clusterID(ctx)
	if err != nil {
		return inbox.OwnerClaim{}, err
	}
	c := inbox.OwnerClaim{
		Owner:     inbox.Owner{Cluster: cluster, Namespace: idc.Namespace, Name: idc.Name, UID: string(idc.UID)},
		Epoch:     statusEpoch(idc),
		AdoptFrom: idc.Annotations[messagingv1alpha1.AnnotationAdoptInboxFrom],
	}
	c.AcceptLoss = c.Epoch != "" && idc.Annotations[messagingv1alpha1.AnnotationAcceptInboxLoss] == c.Epoch
	return c, nil
}

func statusEpoch(idc *messagingv1alpha1.IdempotentConsumer) string {
	if idc.Status.Inbox == nil {
		return ""
	}
	return idc.Status.Inbox.Epoch
}

// ownedMessage is the Conflict message for an inbox another resource owns.
func ownedMessage(e *inbox.OwnedError) string {
	return fmt.Sprintf("inbox %s belongs to %s (recorded in its meta table); this resource claims and deletes nothing there. "+
		"Use another inbox table, or delete one of the two; to take the inbox over (its claims included), annotate this resource with %s=%s",
		e.Inbox, e.Owner, messagingv1alpha1.AnnotationAdoptInboxFrom, e.Owner.Ref())
}

// lostMessage is the InboxLost message: what was lost and the one action
// that accepts starting from what is there now.
func lostMessage(name string, e *inbox.LostError) string {
	return fmt.Sprintf("%s. The claims it held deduplicated every message this consumer applied; nothing was re-created and the runtime holds (it claims and acknowledges nothing). "+
		"Restore the inbox, or accept starting from the inbox as it is now (messages redelivered or replayed from before the loss are applied again): "+
		"kubectl annotate idc %s %s=%s",
		e.Error(), name, messagingv1alpha1.AnnotationAcceptInboxLoss, e.Epoch)
}

func setInboxLost(idc *messagingv1alpha1.IdempotentConsumer, lost bool) {
	v := 0.0
	if lost {
		v = 1
	}
	inboxLost.WithLabelValues(idc.Namespace, idc.Name).Set(v)
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
		if reason == messagingv1alpha1.ReasonPermissionDenied && !errors.As(err, &named) && s.rc.Config.Sink.DatabaseKind() == config.SinkPostgres {
			// A refusal the sink client could not narrow down to one grant
			// (explainInboxPrivilege names it when it can). MySQL's
			// messages name their GRANT themselves (sinkdb.Classify).
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
