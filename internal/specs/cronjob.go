package specs

import (
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// PruneSuspended says whether the prune CronJob must not run, and why.
func PruneSuspended(idc *messagingv1alpha1.IdempotentConsumer, window time.Duration) (bool, string) {
	switch {
	case idc.Spec.Retention.Prune.Suspend:
		return true, "spec.retention.prune.suspend is true"
	case window <= 0:
		return true, "the retention window is not resolved; nothing is deleted until it is"
	}
	return false, ""
}

// PruneCronJob renders the prune CronJob. window is the window in force;
// the job re-derives its own and uses the larger of the two.
func PruneCronJob(idc *messagingv1alpha1.IdempotentConsumer, rc *RuntimeConfig, image, secretsHash string, window time.Duration) *batchv1.CronJob {
	suspend, _ := PruneSuspended(idc, window)
	args := configArgs("prune")
	if window > 0 {
		args = append(args, "--window", window.String())
	}
	container := corev1.Container{Name: "prune", Command: []string{runtimeBinary}, Args: args}
	spec := podSpec(idc, image, rc, container)
	spec.RestartPolicy = corev1.RestartPolicyOnFailure
	maxDuration, _ := time.ParseDuration(string(idc.Spec.Retention.Prune.MaxDuration))
	l := Labels(idc, ComponentPrune)
	return &batchv1.CronJob{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "CronJob"},
		ObjectMeta: metav1.ObjectMeta{Name: CronJobName(idc), Namespace: idc.Namespace, Labels: l},
		Spec: batchv1.CronJobSpec{
			Schedule:                   idc.Spec.Retention.Prune.Schedule,
			ConcurrencyPolicy:          batchv1.ForbidConcurrent,
			StartingDeadlineSeconds:    ptr.To(int64(300)),
			Suspend:                    ptr.To(suspend),
			SuccessfulJobsHistoryLimit: ptr.To(int32(3)),
			FailedJobsHistoryLimit:     ptr.To(int32(3)),
			JobTemplate: batchv1.JobTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: l},
				Spec: batchv1.JobSpec{
					BackoffLimit: ptr.To(int32(2)),
					// A run that exceeds maxDuration stops itself; the deadline
					// is the backstop for a hung one.
					ActiveDeadlineSeconds:   ptr.To(int64((maxDuration + 5*time.Minute).Seconds())),
					TTLSecondsAfterFinished: ptr.To(int32(86400)),
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: l, Annotations: podAnnotations(idc, rc, secretsHash)},
						Spec:       spec,
					},
				},
			},
		},
	}
}
