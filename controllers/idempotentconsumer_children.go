package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

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

// conflictError is a child object of the same name that another owner holds.
type conflictError struct{ kind, name, owner string }

func (e *conflictError) Error() string {
	return fmt.Sprintf("%s %q exists and is not owned by this IdempotentConsumer (owner: %s); rename or delete it", e.kind, e.name, e.owner)
}

// appliedChild is what the manager last applied for one child: the
// rendering's hash and the generation (resourceVersion for objects without
// one) the API server returned.
type appliedChild struct {
	hash    string
	version string
	// refused: the API server refused this rendering as invalid (an
	// *invalidChildError); it is not sent again.
	refused error
}

// liveVersion is what tells that someone changed a live child: its
// generation, or its resourceVersion when it has none (a ConfigMap).
func liveVersion(o client.Object) string {
	if g := o.GetGeneration(); g != 0 {
		return fmt.Sprintf("g%d", g)
	}
	return "rv" + o.GetResourceVersion()
}

// apply server-side-applies a rendered child owned by idc, unless this
// process applied the same rendering to the same live version already. It
// never applies over an object it could not read, nor over one another
// owner holds (a conflictError).
func (r *Reconciler) apply(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, obj client.Object) error {
	gvk := obj.GetObjectKind().GroupVersionKind()
	if err := controllerutil.SetControllerReference(idc, obj, r.scheme); err != nil {
		return fmt.Errorf("owning %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("converting %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	un := unstructuredOf(u, gvk)
	raw, err := json.Marshal(un.Object)
	if err != nil {
		return fmt.Errorf("hashing %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	sum := sha256.Sum256(raw)
	hash := hex.EncodeToString(sum[:12])
	owner, child := client.ObjectKeyFromObject(idc), gvk.Kind+"/"+obj.GetName()
	if last, ok := r.memory.appliedChild(owner, child); ok && last.hash == hash && last.refused != nil {
		// Refused as invalid: the same rendering is refused again.
		return last.refused
	}

	existing, err := r.readChild(ctx, obj)
	if err != nil {
		return err
	}
	if existing != nil {
		if !metav1.IsControlledBy(existing, idc) {
			holder := "none"
			if ref := metav1.GetControllerOf(existing); ref != nil {
				holder = ref.Kind + "/" + ref.Name
			}
			return &conflictError{kind: gvk.Kind, name: obj.GetName(), owner: holder}
		}
		if last, ok := r.memory.appliedChild(owner, child); ok && last.hash == hash && last.version == liveVersion(existing) {
			return nil
		}
	}
	childApplies.WithLabelValues(gvk.Kind).Inc()
	applied := un.DeepCopy()
	if err := r.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(applied), fieldOwner, client.ForceOwnership); err != nil {
		if refused := invalidChild(gvk.Kind, obj.GetName(), err); refused != nil {
			r.memory.putAppliedChild(owner, child, appliedChild{hash: hash, refused: refused})
			return refused
		}
		return fmt.Errorf("applying %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	r.memory.putAppliedChild(owner, child, appliedChild{hash: hash, version: liveVersion(applied)})
	return nil
}

// readChild reads a child from the cache and, when the cache does not hold
// it, from the API server: the cache holds only objects with the
// operator's managed-by label, so one of the same name that someone else
// created is seen only there. nil means there is none.
func (r *Reconciler) readChild(ctx context.Context, obj client.Object) (client.Object, error) {
	gvk := obj.GetObjectKind().GroupVersionKind()
	existing := obj.DeepCopyObject().(client.Object)
	err := r.client.Get(ctx, client.ObjectKeyFromObject(obj), existing)
	if apierrors.IsNotFound(err) {
		err = r.live.Get(ctx, client.ObjectKeyFromObject(obj), existing)
	}
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading %s %s before applying it: %w", gvk.Kind, obj.GetName(), err)
	}
	return existing, nil
}
