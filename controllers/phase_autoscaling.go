package controllers

import (
	"context"
	"fmt"
	"strings"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// +kubebuilder:rbac:groups=keda.sh,resources=scaledobjects;triggerauthentications,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=get

// kedaHPAPrefix is how KEDA names the HorizontalPodAutoscaler it makes for
// a ScaledObject (keda-hpa-<name>).
const kedaHPAPrefix = "keda-hpa-"

// autoscaled is the resource's autoscaling spec, nil when it scales by
// spec.runtime.replicas.
func autoscaled(idc *messagingv1alpha1.IdempotentConsumer) *messagingv1alpha1.AutoscalingSpec {
	return idc.Spec.Runtime.Autoscaling
}

// replicasWithoutKEDA is what the Deployment runs when autoscaling is
// declared but KEDA is not installed: minReplicas, and 1 for minReplicas
// 0, since nothing would ever wake a consumer at 0.
func replicasWithoutKEDA(a *messagingv1alpha1.AutoscalingSpec) int32 {
	return max(a.MinReplicasOrDefault(), 1)
}

// autoscalingPhase renders the ScaledObject and TriggerAuthentication when
// spec.runtime.autoscaling is set and KEDA is installed, removes the ones a
// resource no longer wants, and reads what KEDA decided for the status.
// It runs after the children phase, which applied the Deployment with or
// without replicas (deploymentReplicas).
func (r *Reconciler) autoscalingPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	idc := s.idc
	a := autoscaled(idc)
	if a == nil {
		return ctrl.Result{}, r.removeScaledObject(ctx, s)
	}
	if !s.kedaInstalled {
		s.obs.autoscaling = failed(messagingv1alpha1.ReasonKEDANotInstalled, fmt.Sprintf(
			"spec.runtime.autoscaling is set but KEDA is not installed (no keda.sh/v1alpha1 ScaledObject in the API): the Deployment runs a fixed %d replica(s) (minReplicas, at least 1) until KEDA is installed", replicasWithoutKEDA(a)))
		s.setScale(replicasWithoutKEDA(a), fmt.Sprintf("KEDA is not installed: fixed at max(minReplicas, 1) = %d", replicasWithoutKEDA(a)))
		return ctrl.Result{}, nil
	}
	paused := idc.Spec.Suspend || !s.obs.effect.ok
	hold := specs.ScaleHold{Paused: paused, AwaitConsumer: s.reading != nil && s.reading.reading.ConsumerMissing}
	workloads := specs.Workloads(idc)
	for _, w := range workloads {
		so, ta, err := specs.ScaledObject(idc, &s.rc.RuntimeConfig, hold, w)
		if err != nil {
			s.obs.autoscaling = failed(messagingv1alpha1.ReasonInvalidSpec, err.Error())
			return ctrl.Result{}, nil
		}
		for _, obj := range []*unstructured.Unstructured{ta, so} {
			if obj == nil {
				continue
			}
			if err := r.apply(ctx, idc, obj); err != nil {
				if meta.IsNoMatchError(err) {
					// KEDA went away since discovery was asked.
					r.opts.KEDA.Forget()
				}
				return ctrl.Result{}, r.childRefused(s, err)
			}
			if s.halted {
				return ctrl.Result{}, nil
			}
		}
	}
	idc.Status.Runtime.ScaledObject = workloads[0].Name
	return ctrl.Result{}, r.observeScaling(ctx, s, a, hold, workloads)
}

// observeScaling reads the ScaledObjects' conditions and their
// HorizontalPodAutoscalers into the Autoscaling condition and the status'
// desired replicas and reason (each partition's, for a partitioned
// resource).
func (r *Reconciler) observeScaling(ctx context.Context, s *scope, a *messagingv1alpha1.AutoscalingSpec, hold specs.ScaleHold, workloads []specs.Workload) error {
	idc := s.idc
	s.obs.autoscaling = okOutcome(messagingv1alpha1.ReasonScaledByKEDA,
		fmt.Sprintf("KEDA scales the Deployment between %d and %d replicas at %d backlog per replica", hold.MinReplicas(a), a.MaxReplicas, specs.LagPerReplica(idc, &s.rc.RuntimeConfig)))
	if len(workloads) > 1 {
		s.obs.autoscaling.message = fmt.Sprintf("KEDA scales each of the %d partitions' Deployments between %d and %d replicas at %d backlog per replica of its own consumer",
			len(workloads), hold.MinReplicas(a), a.MaxReplicas, specs.LagPerReplica(idc, &s.rc.RuntimeConfig))
	}
	var reasons []string
	for _, w := range workloads {
		why, err := r.observeScaledObject(ctx, s, a, hold, w)
		if err != nil {
			return err
		}
		if w.Partitioned() {
			why = fmt.Sprintf("partition %d: %s", w.Partition, why)
		}
		reasons = append(reasons, why)
	}
	why := strings.Join(reasons, "; ")
	if hold.AwaitConsumer && hold.MinReplicas(a) != a.MinReplicasOrDefault() {
		why = fmt.Sprintf("minReplicas 0 held at 1 until the broker has the consumer KEDA reads the lag from (the runtime creates it on its first start; at 0 nothing would); %s", why)
	}
	s.setScale(s.liveReplicas, why)
	return nil
}

// observeScaledObject reads one workload's ScaledObject into the
// Autoscaling condition (the first that is not ready speaks) and returns
// why its HorizontalPodAutoscaler wants its replicas.
func (r *Reconciler) observeScaledObject(ctx context.Context, s *scope, a *messagingv1alpha1.AutoscalingSpec, hold specs.ScaleHold, w specs.Workload) (string, error) {
	idc := s.idc
	live := &unstructured.Unstructured{}
	live.SetGroupVersionKind(specs.GVKScaledObject)
	if err := r.live.Get(ctx, client.ObjectKey{Namespace: idc.Namespace, Name: w.Name}, live); err != nil {
		return "", fmt.Errorf("reading the ScaledObject %s back: %w", w.Name, err)
	}
	ready, active := scaledObjectConditions(live)
	if s.obs.autoscaling.ok {
		switch {
		case ready == nil:
			s.obs.autoscaling = failed(messagingv1alpha1.ReasonScaledObjectNotReady, fmt.Sprintf("KEDA has not reported on the ScaledObject %s yet (is the KEDA operator running?)", w.Name))
		case ready.status != "True":
			s.obs.autoscaling = failed(messagingv1alpha1.ReasonScaledObjectNotReady, "KEDA: "+ready.message)
		}
	}
	if hold.Paused {
		return "held at 0 by the ScaledObject's paused-replicas (spec.suspend, or EffectReady False)", nil
	}
	var hpa autoscalingv2.HorizontalPodAutoscaler
	err := r.live.Get(ctx, client.ObjectKey{Namespace: idc.Namespace, Name: kedaHPAPrefix + w.Name}, &hpa)
	switch {
	case apierrors.IsNotFound(err):
		return "KEDA has not created its HorizontalPodAutoscaler yet", nil
	case err != nil:
		return "", fmt.Errorf("reading KEDA's HorizontalPodAutoscaler: %w", err)
	}
	return hpaReason(&hpa, a, specs.LagPerReplica(idc, &s.rc.RuntimeConfig), active), nil
}

// hpaReason says why the HPA wants its replica count: the backlog per
// replica it read and the bounds. Pure.
func hpaReason(hpa *autoscalingv2.HorizontalPodAutoscaler, a *messagingv1alpha1.AutoscalingSpec, perReplica int64, active *kedaCondition) string {
	var parts []string
	if active != nil && active.status != "True" && a.MinReplicasOrDefault() == 0 {
		parts = append(parts, fmt.Sprintf("no backlog above activationLag %d: KEDA scales to 0 after cooldownPeriod %s", a.ActivationLag, a.CooldownPeriod))
	}
	for _, m := range hpa.Status.CurrentMetrics {
		if m.External == nil || m.External.Current.AverageValue == nil {
			continue
		}
		parts = append(parts, fmt.Sprintf("backlog %s per replica (target %d)", m.External.Current.AverageValue.String(), perReplica))
	}
	parts = append(parts, fmt.Sprintf("HorizontalPodAutoscaler %s wants %d of %d..%d", hpa.Name, hpa.Status.DesiredReplicas, a.MinReplicasOrDefault(), a.MaxReplicas))
	return "KEDA: " + strings.Join(parts, "; ")
}

type kedaCondition struct{ status, message string }

// scaledObjectConditions reads KEDA's Ready and Active conditions.
func scaledObjectConditions(so *unstructured.Unstructured) (ready, active *kedaCondition) {
	conds, _, _ := unstructured.NestedSlice(so.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok {
			continue
		}
		kc := &kedaCondition{}
		kc.status, _ = m["status"].(string)
		kc.message, _ = m["message"].(string)
		switch m["type"] {
		case "Ready":
			ready = kc
		case "Active":
			active = kc
		}
	}
	return ready, active
}

// removeScaledObject deletes the ScaledObject and TriggerAuthentication a
// resource made while it autoscaled. Only a resource whose status names a
// ScaledObject asks: the others send no request for KEDA objects.
func (r *Reconciler) removeScaledObject(ctx context.Context, s *scope) error {
	if s.before.Status.Runtime == nil || s.before.Status.Runtime.ScaledObject == "" {
		return nil
	}
	var objs []client.Object
	for _, w := range specs.Workloads(s.idc) {
		so := &unstructured.Unstructured{}
		so.SetGroupVersionKind(specs.GVKScaledObject)
		so.SetNamespace(s.idc.Namespace)
		so.SetName(w.Name)
		objs = append(objs, so)
	}
	for _, obj := range append(objs, emptyTriggerAuth(s.idc)) {
		existing := obj.DeepCopyObject().(client.Object)
		err := r.live.Get(ctx, client.ObjectKeyFromObject(obj), existing)
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading the %s to remove: %w", obj.GetObjectKind().GroupVersionKind().Kind, err)
		}
		if !metav1.IsControlledBy(existing, s.idc) {
			continue
		}
		if err := r.client.Delete(ctx, existing); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting the %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, err)
		}
		r.memory.forgetChild(s.key, obj.GetObjectKind().GroupVersionKind().Kind+"/"+obj.GetName())
	}
	return nil
}

func emptyTriggerAuth(idc *messagingv1alpha1.IdempotentConsumer) *unstructured.Unstructured {
	ta := &unstructured.Unstructured{}
	ta.SetGroupVersionKind(specs.GVKTriggerAuthentication)
	ta.SetNamespace(idc.Namespace)
	ta.SetName(specs.TriggerAuthName(idc))
	return ta
}
