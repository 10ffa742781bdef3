package controllers

import (
	"context"
	"fmt"
	"strconv"
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
	var replicas *int32
	override := false
	if a := autoscaled(idc); a != nil {
		installed, err := r.opts.KEDA.Installed(ctx)
		if err != nil {
			return ctrl.Result{}, err
		}
		s.kedaInstalled = installed
		replicas, override = deploymentReplicas(idc, installed), true
	}
	if !s.obs.effect.ok {
		// Nothing may be fetched until the sink can take the effect.
		replicas, override = ptr.To(int32(0)), true
	}
	workloads := specs.Workloads(idc)
	deps := make([]*appsv1.Deployment, len(workloads))
	children := []client.Object{specs.ConfigMap(idc, &rc.RuntimeConfig)}
	for i, w := range workloads {
		deps[i] = specs.Deployment(idc, &rc.RuntimeConfig, image, s.secrets.hash, w)
		if override {
			deps[i].Spec.Replicas = replicas
		}
		children = append(children, deps[i])
	}
	children = append(children, specs.PruneCronJob(idc, &rc.RuntimeConfig, image, s.secrets.hash, s.window))
	for _, obj := range children {
		if err := r.apply(ctx, idc, obj); err != nil {
			// A child another owner holds, or one the API server refused
			// as invalid, stalls; nothing after it runs.
			return ctrl.Result{}, r.childRefused(s, err)
		}
	}

	st, partitions, err := r.observeWorkloads(ctx, s, workloads, deps)
	if err != nil {
		return ctrl.Result{}, err
	}
	idc.Status.Runtime = st
	idc.Status.Partitions = partitions
	if autoscaled(idc) == nil {
		s.setScale(s.liveReplicas, scaleReasonDeclared(idc, s.obs.effect.ok))
	}
	if !s.obs.effect.ok && !idc.Spec.Suspend {
		s.obs.runtime = failed(messagingv1alpha1.ReasonWaitingForEffect,
			fmt.Sprintf("the Deployment is held at 0 replicas until EffectReady is True (%s)", s.obs.effect.reason))
	}
	s.obs.prune = pruneOutcome(idc, s.window)
	return ctrl.Result{}, nil
}

// observeWorkloads reads the Deployments back: the runtime status adds up
// the workloads (s.liveReplicas too), s.obs.runtime is the first workload
// that is not available (or all of them), and a partitioned resource gets
// each partition's status.
func (r *Reconciler) observeWorkloads(ctx context.Context, s *scope, workloads []specs.Workload, deps []*appsv1.Deployment) (*messagingv1alpha1.RuntimeStatus, []messagingv1alpha1.PartitionStatus, error) {
	idc := s.idc
	// The cache may not have seen a Deployment created a moment ago; the
	// Owns watch brings us back when it does.
	st := &messagingv1alpha1.RuntimeStatus{Selector: specs.Selector(idc)}
	if len(workloads) == 1 {
		st.Deployment = deps[0].Name
	}
	s.liveReplicas = 0
	var partitions []messagingv1alpha1.PartitionStatus
	for i, dep := range deps {
		var live appsv1.Deployment
		if err := r.client.Get(ctx, client.ObjectKeyFromObject(dep), &live); client.IgnoreNotFound(err) != nil {
			return nil, nil, fmt.Errorf("reading the Deployment %s back: %w", dep.Name, err)
		}
		st.Replicas += live.Status.Replicas
		st.ReadyReplicas += live.Status.ReadyReplicas
		if live.Spec.Replicas != nil {
			s.liveReplicas += *live.Spec.Replicas
		} else if dep.Spec.Replicas != nil {
			s.liveReplicas += *dep.Spec.Replicas
		}
		o := runtimeOutcome(idc, &live)
		if w := workloads[i]; w.Partitioned() {
			partitions = append(partitions, messagingv1alpha1.PartitionStatus{
				Partition: int32(w.Partition), Deployment: w.Name, Consumer: w.Consumer,
				Replicas: live.Status.Replicas, ReadyReplicas: live.Status.ReadyReplicas, Ready: o.ok,
				Lag: observePartitionLag(s, w.Partition),
			})
			if !o.ok {
				o.message = fmt.Sprintf("partition %d (Deployment %s): %s", w.Partition, w.Name, o.message)
			}
		}
		// The first workload that is not ready speaks for the resource.
		if i == 0 || (s.obs.runtime.ok && !o.ok) {
			s.obs.runtime = o
		}
	}
	if len(partitions) > 0 && s.obs.runtime.ok && !idc.Spec.Suspend {
		s.obs.runtime.message = fmt.Sprintf("%d partitions, %d/%d replicas ready", len(partitions), st.ReadyReplicas, st.Replicas)
	}
	return st, partitions, nil
}

// observePartitionLag is partition i's status lag after the pass: the
// broker phase's reading of its durable (also the exact figure in
// idc_resource_partition_lag_messages), by bucket as status.lag is.
func observePartitionLag(s *scope, i int) *int64 {
	var before *int64
	for _, p := range s.before.Status.Partitions {
		if int(p.Partition) == i {
			before = p.Lag
		}
	}
	var read *int64
	if s.reading != nil && i < len(s.reading.reading.PartitionLags) {
		read = s.reading.reading.PartitionLags[i]
	}
	if read != nil {
		resourcePartitionLag.WithLabelValues(s.key.Namespace, s.key.Name, strconv.Itoa(i)).Set(float64(*read))
	}
	return statusLag(before, read)
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
