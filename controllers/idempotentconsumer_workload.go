package controllers

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete

// workloadPhase applies the consumer's PodDisruptionBudget (with more than
// one replica declared and not suspended; --pod-disruption-budgets) and its
// NetworkPolicy (--network-policies), and deletes the ones no longer
// wanted.
func (r *Reconciler) workloadPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	idc := s.idc
	pdb := specs.PodDisruptionBudget(idc)
	wantPDB := !r.opts.NoPodDisruptionBudgets && desiredReplicasDeclared(idc) > 1 && !idc.Spec.Suspend
	np := specs.NetworkPolicy(idc, &s.rc.RuntimeConfig, s.secrets.getenv)
	for _, c := range []struct {
		obj  client.Object
		want bool
	}{{pdb, wantPDB}, {np, r.opts.NetworkPolicies}} {
		if err := r.applyOrRemove(ctx, s, c.obj, c.want); err != nil {
			return ctrl.Result{}, err
		}
		if s.halted {
			return ctrl.Result{}, nil
		}
	}
	return ctrl.Result{}, nil
}

// applyOrRemove applies obj when wanted, else deletes the live one when this
// resource controls it.
func (r *Reconciler) applyOrRemove(ctx context.Context, s *scope, obj client.Object, want bool) error {
	if want {
		if err := r.apply(ctx, s.idc, obj); err != nil {
			return r.childRefused(s, err)
		}
		return nil
	}
	// Only the cache is asked: a child this resource made carries the
	// managed-by label the cache selects on, so one the cache lacks is not
	// ours to delete, and a pass reads nothing from the API server for a
	// child it does not want (a GET per pass and resource otherwise).
	existing := obj.DeepCopyObject().(client.Object)
	if err := r.client.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil || !metav1.IsControlledBy(existing, s.idc) {
		return client.IgnoreNotFound(err)
	}
	if err := r.client.Delete(ctx, existing); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
	}
	r.memory.forgetChild(client.ObjectKeyFromObject(s.idc), obj.GetObjectKind().GroupVersionKind().Kind+"/"+obj.GetName())
	return nil
}
