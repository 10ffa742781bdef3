package controllers

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// childrenPhase applies the ConfigMap, Deployment and CronJob and reads the
// Deployment's availability. A child of the same name that another owner
// holds stalls the pass with Conflict, one the API server refuses as
// invalid with InvalidSpec naming the spec field: nothing after it runs (no
// redrive Job is created for a resource whose children are not its own),
// and Ready is False with the same reason.
func (r *Reconciler) childrenPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	idc, rc := s.idc, s.rc
	image := runtimeImageFor(idc, r.opts.RuntimeImage)
	dep := specs.Deployment(idc, &rc.RuntimeConfig, image, s.secrets.hash)
	if a := autoscaled(idc); a != nil {
		installed, err := r.opts.KEDA.Installed(ctx)
		if err != nil {
			return ctrl.Result{}, err
		}
		s.kedaInstalled = installed
		dep.Spec.Replicas = deploymentReplicas(idc, installed)
	}
	if !s.obs.effect.ok {
		// Nothing may be fetched until the sink can take the effect.
		dep.Spec.Replicas = ptr.To(int32(0))
	}
	for _, obj := range []client.Object{specs.ConfigMap(idc, &rc.RuntimeConfig), dep, specs.PruneCronJob(idc, &rc.RuntimeConfig, image, s.secrets.hash, s.window)} {
		if err := r.apply(ctx, idc, obj); err != nil {
			// A child another owner holds, or one the API server refused
			// as invalid, stalls; nothing after it runs.
			return ctrl.Result{}, r.childRefused(s, err)
		}
	}

	// The cache may not have seen a Deployment created a moment ago; the
	// Owns watch brings us back when it does.
	var live appsv1.Deployment
	if err := r.client.Get(ctx, client.ObjectKeyFromObject(dep), &live); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("reading the Deployment back: %w", err)
	}
	idc.Status.Runtime = &messagingv1alpha1.RuntimeStatus{
		Deployment: dep.Name, Replicas: live.Status.Replicas, ReadyReplicas: live.Status.ReadyReplicas, Selector: specs.Selector(idc),
	}
	if live.Spec.Replicas != nil {
		s.liveReplicas = *live.Spec.Replicas
	} else if dep.Spec.Replicas != nil {
		s.liveReplicas = *dep.Spec.Replicas
	}
	if autoscaled(idc) == nil {
		s.setScale(s.liveReplicas, scaleReasonDeclared(idc, s.obs.effect.ok))
	}
	s.obs.runtime = runtimeOutcome(idc, &live)
	if !s.obs.effect.ok && !idc.Spec.Suspend {
		s.obs.runtime = failed(messagingv1alpha1.ReasonWaitingForEffect,
			fmt.Sprintf("the Deployment is held at 0 replicas until EffectReady is True (%s)", s.obs.effect.reason))
	}
	s.obs.prune = pruneOutcome(idc, s.window)
	return ctrl.Result{}, nil
}

// deploymentReplicas is the replicas the Deployment is applied with under
// autoscaling: none with KEDA installed (KEDA's HorizontalPodAutoscaler
// owns the field; the controller's apply stops owning it), 0 while
// suspended, else max(minReplicas, 1) without KEDA.
func deploymentReplicas(idc *messagingv1alpha1.IdempotentConsumer, kedaInstalled bool) *int32 {
	switch {
	case idc.Spec.Suspend:
		return ptr.To(int32(0))
	case kedaInstalled:
		return nil
	default:
		return ptr.To(replicasWithoutKEDA(autoscaled(idc)))
	}
}

// scaleReasonDeclared is the status' scale reason without autoscaling.
func scaleReasonDeclared(idc *messagingv1alpha1.IdempotentConsumer, effectOK bool) string {
	switch {
	case idc.Spec.Suspend:
		return "spec.suspend: 0"
	case !effectOK:
		return "held at 0 until EffectReady is True"
	}
	return fmt.Sprintf("spec.runtime.replicas: %d", specs.DesiredReplicas(idc))
}

func runtimeOutcome(idc *messagingv1alpha1.IdempotentConsumer, d *appsv1.Deployment) outcome {
	if idc.Spec.Suspend {
		return okOutcome(messagingv1alpha1.ReasonSuspended, "spec.suspend is true: the runtime is scaled to 0 replicas")
	}
	if d.ResourceVersion == "" {
		return failed(messagingv1alpha1.ReasonDeploymentNotReady, "the Deployment was just created; waiting for it to report status")
	}
	if ok, msg := deploymentAvailable(d); ok {
		return okOutcome(messagingv1alpha1.ReasonReady, msg)
	} else {
		return failed(messagingv1alpha1.ReasonDeploymentNotReady, msg)
	}
}

func pruneOutcome(idc *messagingv1alpha1.IdempotentConsumer, window time.Duration) outcome {
	if suspended, why := specs.PruneSuspended(idc, window); suspended {
		reason := messagingv1alpha1.ReasonWaitingForWindow
		if idc.Spec.Retention.Prune.Suspend {
			reason = messagingv1alpha1.ReasonPruneSuspended
		}
		return failed(reason, "the prune CronJob is suspended: "+why)
	}
	return okOutcome(messagingv1alpha1.ReasonScheduled,
		fmt.Sprintf("prune runs on %q and deletes ids older than %s", idc.Spec.Retention.Prune.Schedule, window))
}

// deploymentAvailable reads the Deployment's Available condition for the
// current generation.
func deploymentAvailable(d *appsv1.Deployment) (bool, string) {
	if d == nil {
		return false, "the Deployment does not exist yet"
	}
	if d.Status.ObservedGeneration < d.Generation {
		return false, fmt.Sprintf("the Deployment controller has not observed generation %d yet", d.Generation)
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			if c.Status == corev1.ConditionTrue {
				return true, fmt.Sprintf("%d/%d replicas ready", d.Status.ReadyReplicas, ptr.Deref(d.Spec.Replicas, 1))
			}
			return false, fmt.Sprintf("Deployment not available: %s", c.Message)
		}
	}
	return false, fmt.Sprintf("waiting for the Deployment to report availability (%d/%d replicas ready)", d.Status.ReadyReplicas, ptr.Deref(d.Spec.Replicas, 1))
}
