package controllers

import (
	"context"

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
