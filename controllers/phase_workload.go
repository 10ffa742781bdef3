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
	wantPDB := !r.opts.NoPodDisruptionBudgets && desiredReplicasDeclared(idc) > 1 && !idc.Spec.Suspend
	type child struct {
		obj  client.Object
		want bool
	}
	var children []child
	// One PodDisruptionBudget per workload (per partition).
	for _, w := range specs.Workloads(idc) {
		children = append(children, child{specs.PodDisruptionBudget(idc, w), wantPDB})
	}
	children = append(children, child{specs.NetworkPolicy(idc, &s.rc.RuntimeConfig, s.secrets.getenv), r.opts.NetworkPolicies})
	for _, c := range children {
		if err := r.applyOrRemove(ctx, s, c.obj, c.want); err != nil {
			return ctrl.Result{}, err
		}
		if s.halted {
			return ctrl.Result{}, nil
		}
	}
	return ctrl.Result{}, nil
}
