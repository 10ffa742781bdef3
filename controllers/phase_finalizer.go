package controllers

import (
	"context"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// FinalizerDropInbox guards the inbox tables of a resource whose
// deletionPolicy is Delete: they are dropped before the resource goes.
const FinalizerDropInbox = "messaging.idempotency.dev/drop-inbox"

// finalizerPhase adds the drop-inbox finalizer for deletionPolicy Delete
// (and removes it for Retain) once the spec is known to render, before the
// first table is created: a resource that never rendered has nothing to
// drop and must never be held by the finalizer.
func (r *Reconciler) finalizerPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	want := s.idc.Spec.Sink.Inbox.DeletionPolicy == messagingv1alpha1.DeletionPolicyDelete
	if want == controllerutil.ContainsFinalizer(s.idc, FinalizerDropInbox) {
		return ctrl.Result{}, nil
	}
	patch := client.MergeFrom(s.idc.DeepCopy())
	if want {
		controllerutil.AddFinalizer(s.idc, FinalizerDropInbox)
	} else {
		controllerutil.RemoveFinalizer(s.idc, FinalizerDropInbox)
	}
	if err := r.client.Patch(ctx, s.idc, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("updating the finalizer: %w", err)
	}
	// The patch moved the resource's version; status is patched against it.
	s.before.Finalizers, s.before.ResourceVersion = s.idc.Finalizers, s.idc.ResourceVersion
	return ctrl.Result{}, nil
}
