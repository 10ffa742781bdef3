package podrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// deploymentRun is the local state of one Deployment: the pods of its
// current template.
type deploymentRun struct {
	hash string
	pods []*pod
}

func (r *Runner) syncDeployments(ctx context.Context) error {
	var list appsv1.DeploymentList
	if err := r.c.List(ctx, &list, client.InNamespace(r.opts.Namespace)); err != nil {
		return fmt.Errorf("listing Deployments: %w", err)
	}
	seen := map[string]bool{}
	for i := range list.Items {
		d := &list.Items[i]
		seen[d.Name] = true
		if err := r.syncDeployment(ctx, d); err != nil {
			r.opts.Log.Error(err, "syncing a Deployment", "deployment", d.Name)
		}
	}
	for name, run := range r.deployments {
		if !seen[name] {
			r.opts.Log.Info("Deployment deleted, stopping its pods", "deployment", name)
			r.stopInBackground(run.pods...)
			delete(r.deployments, name)
		}
	}
	return nil
}

// syncDeployment replaces the pods when the template changed, scales to
// spec.replicas and reports status.
func (r *Runner) syncDeployment(ctx context.Context, d *appsv1.Deployment) error {
	run := r.deployments[d.Name]
	if run == nil {
		run = &deploymentRun{}
		r.deployments[d.Name] = run
	}
	hash := templateHash(&d.Spec.Template)
	if hash != run.hash && len(run.pods) > 0 {
		r.opts.Log.Info("pod template changed, replacing the pods", "deployment", d.Name, "from", run.hash, "to", hash)
		r.stopInBackground(run.pods...)
		run.pods = nil
	}
	run.hash = hash
	want := int(ptr.Deref(d.Spec.Replicas, 1))
	if len(run.pods) > want {
		r.stopInBackground(run.pods[want:]...)
		run.pods = run.pods[:want]
	}
	for len(run.pods) < want {
		p, err := r.startPod(podTemplate{
			owner: "Deployment/" + d.Name, namePrefix: fmt.Sprintf("%s-%s-", d.Name, hash),
			template: &d.Spec.Template, restartPolicy: corev1.RestartPolicyAlways,
		})
		if err != nil {
			return err
		}
		run.pods = append(run.pods, p)
	}
	infos := make([]PodInfo, len(run.pods))
	for i, p := range run.pods {
		infos[i] = p.snapshot()
	}
	st := deploymentStatus(d, infos, metav1.Now())
	if equality.Semantic.DeepEqual(st, d.Status) {
		return nil
	}
	d.Status = st
	if err := r.c.Status().Update(ctx, d); err != nil {
		return fmt.Errorf("updating the status of Deployment %s: %w", d.Name, err)
	}
	return nil
}

// templateHash names a pod template, like the pod-template-hash label.
func templateHash(t *corev1.PodTemplateSpec) string {
	b, _ := json.Marshal(t) // a typed API object always marshals
	h := fnv.New32a()
	_, _ = h.Write(b)
	return rand.SafeEncodeString(fmt.Sprint(h.Sum32()))
}

// deploymentStatus is the status the Deployment controller would write for
// these pods (all of the current template).
func deploymentStatus(d *appsv1.Deployment, pods []PodInfo, now metav1.Time) appsv1.DeploymentStatus {
	want := ptr.Deref(d.Spec.Replicas, 1)
	var ready int32
	for _, p := range pods {
		if p.Ready {
			ready++
		}
	}
	n := int32(len(pods))
	st := appsv1.DeploymentStatus{
		ObservedGeneration: d.Generation,
		Replicas:           n, UpdatedReplicas: n, ReadyReplicas: ready, AvailableReplicas: ready,
		UnavailableReplicas: max(want-ready, 0),
		CollisionCount:      d.Status.CollisionCount,
	}
	available := ready >= want-maxUnavailable(d, want)
	availableCond := appsv1.DeploymentCondition{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue,
		Reason: "MinimumReplicasAvailable", Message: "Deployment has minimum availability."}
	if !available {
		availableCond.Status, availableCond.Reason, availableCond.Message = corev1.ConditionFalse,
			"MinimumReplicasUnavailable", "Deployment does not have minimum availability."
	}
	progressing := appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue,
		Reason: "NewReplicaSetAvailable", Message: fmt.Sprintf("%d/%d local pods ready.", ready, want)}
	if ready < want {
		progressing.Reason = "ReplicaSetUpdated"
	}
	st.Conditions = []appsv1.DeploymentCondition{
		carryTimes(availableCond, d.Status.Conditions, now),
		carryTimes(progressing, d.Status.Conditions, now),
	}
	return st
}

// carryTimes keeps a condition's times while nothing about it changed, so an
// unchanged status compares equal and is not written again.
func carryTimes(c appsv1.DeploymentCondition, old []appsv1.DeploymentCondition, now metav1.Time) appsv1.DeploymentCondition {
	c.LastUpdateTime, c.LastTransitionTime = now, now
	for _, o := range old {
		if o.Type != c.Type {
			continue
		}
		if o.Status == c.Status {
			c.LastTransitionTime = o.LastTransitionTime
		}
		if o.Status == c.Status && o.Reason == c.Reason && o.Message == c.Message {
			c.LastUpdateTime = o.LastUpdateTime
		}
	}
	return c
}

// maxUnavailable is the rolling update's maxUnavailable (default 25%, rounded
// down, as the Deployment controller computes it).
func maxUnavailable(d *appsv1.Deployment, want int32) int32 {
	v := intstr.FromString("25%")
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil && ru.MaxUnavailable != nil {
		v = *ru.MaxUnavailable
	}
	if d.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
		return 0
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, int(want), false)
	if err != nil {
		return 0
	}
	return int32(min(n, int(want)))
}
