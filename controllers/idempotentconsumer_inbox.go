package controllers

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
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

// inboxAnnotationChanged wakes a resource when a person adopts an inbox or
// accepts a loss.
var inboxAnnotationChanged = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.GetAnnotations(), e.ObjectNew.GetAnnotations()
		return o[messagingv1alpha1.AnnotationAdoptInboxFrom] != n[messagingv1alpha1.AnnotationAdoptInboxFrom] ||
			o[messagingv1alpha1.AnnotationAcceptInboxLoss] != n[messagingv1alpha1.AnnotationAcceptInboxLoss]
	},
}
