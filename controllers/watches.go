package controllers

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

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

// redriveAnnotationChanged passes updates that change the redrive
// annotations, which GenerationChangedPredicate does not see.
var redriveAnnotationChanged = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.GetAnnotations(), e.ObjectNew.GetAnnotations()
		return o[messagingv1alpha1.AnnotationRedrive] != n[messagingv1alpha1.AnnotationRedrive] ||
			o[messagingv1alpha1.AnnotationRedriveReason] != n[messagingv1alpha1.AnnotationRedriveReason] ||
			o[messagingv1alpha1.AnnotationRedriveIDs] != n[messagingv1alpha1.AnnotationRedriveIDs]
	},
}

// secretIndexKey indexes IdempotentConsumers by the Secrets they reference so
// a Secret change is mapped back to its owners.
const secretIndexKey = ".spec.secretRefs"

// secretNames lists the Secrets a resource references (for the field index).
func secretNames(idc *messagingv1alpha1.IdempotentConsumer) []string {
	rc, err := renderConfig(idc)
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range rc.Secrets {
		if !seen[s.Ref.Name] {
			seen[s.Ref.Name] = true
			out = append(out, s.Ref.Name)
		}
	}
	return out
}

// SetupWithManager registers the controller, its watches and field indexes.
// The manager's cache must be built with CacheOptions.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	ctx := context.Background()
	indexes := map[string]func(*messagingv1alpha1.IdempotentConsumer) []string{
		secretIndexKey:   secretNames,
		inboxIndexKey:    func(idc *messagingv1alpha1.IdempotentConsumer) []string { return []string{inboxIdentity(idc)} },
		consumerIndexKey: func(idc *messagingv1alpha1.IdempotentConsumer) []string { return []string{consumerIdentity(idc)} },
	}
	for key, fn := range indexes {
		if err := idx.IndexField(ctx, &messagingv1alpha1.IdempotentConsumer{}, key, func(o client.Object) []string {
			return fn(o.(*messagingv1alpha1.IdempotentConsumer))
		}); err != nil {
			return fmt.Errorf("indexing %s: %w", key, err)
		}
	}
	if err := registerStateCollector(NewStateCollector(mgr.GetCache())); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("idempotentconsumer").
		For(&messagingv1alpha1.IdempotentConsumer{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, redriveAnnotationChanged, inboxAnnotationChanged, deletionMarked))).
		Owns(&appsv1.Deployment{}, builder.WithPredicates(childChanged)).
		Owns(&batchv1.CronJob{}, builder.WithPredicates(childChanged)).
		Owns(&batchv1.Job{}, builder.WithPredicates(childChanged)).
		Owns(&corev1.ConfigMap{}, builder.WithPredicates(childChanged)).
		Owns(&policyv1.PodDisruptionBudget{}, builder.WithPredicates(childChanged)).
		Owns(&networkingv1.NetworkPolicy{}, builder.WithPredicates(childChanged)).
		// Only Secret metadata is cached: enough to map a change to its
		// consumers; the data is read on demand.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.consumersOfSecret), builder.OnlyMetadata).
		// A resource that goes away releases its inbox table and broker
		// consumer: the one that lost the conflict takes over at once.
		Watches(&messagingv1alpha1.IdempotentConsumer{}, handler.EnqueueRequestsFromMapFunc(r.rivalsOf), builder.WithPredicates(goingAway)).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.MaxConcurrent}).
		Complete(r)
}

// childChanged passes every event of an owned child but its creation: the
// reconciler created it in the pass that is running (or, at start, the
// owner's own event is queued anyway), so a pass for it would only read
// back what was just written: one pass per resource and child kind saved
// when many resources are created at once. Updates (status, someone's
// edit) and deletions still wake the owner.
var childChanged = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
}

// goingAway passes deletions and the update that marks a resource deleted.
var goingAway = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
	},
}

// deletionMarked passes the update that sets the deletion timestamp (it
// does not change the generation when a finalizer holds the object).
var deletionMarked = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
	UpdateFunc:  goingAway.UpdateFunc,
}

// rivalsOf maps a resource to the others claiming its inbox table or its
// broker consumer.
func (r *Reconciler) rivalsOf(ctx context.Context, o client.Object) []reconcile.Request {
	idc, ok := o.(*messagingv1alpha1.IdempotentConsumer)
	if !ok {
		return nil
	}
	var out []reconcile.Request
	for index, value := range map[string]string{inboxIndexKey: inboxIdentity(idc), consumerIndexKey: consumerIdentity(idc)} {
		var list messagingv1alpha1.IdempotentConsumerList
		if err := r.client.List(ctx, &list, client.MatchingFields{index: value}); err != nil {
			log.FromContext(ctx).Error(err, "listing resources that conflict with a deleted one", "consumer", klog.KObj(o))
			continue
		}
		for _, other := range list.Items {
			if other.UID != idc.UID {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: other.Namespace, Name: other.Name}})
			}
		}
	}
	return out
}

// consumersOfSecret maps a Secret to the resources that reference it.
func (r *Reconciler) consumersOfSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var list messagingv1alpha1.IdempotentConsumerList
	if err := r.client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{secretIndexKey: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing consumers of a Secret", "secret", klog.KObj(o))
		return nil
	}
	out := make([]reconcile.Request, len(list.Items))
	for i, idc := range list.Items {
		out[i] = reconcile.Request{NamespacedName: types.NamespacedName{Namespace: idc.Namespace, Name: idc.Name}}
	}
	return out
}
