package specs

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// RedriveJob renders the Job of one redrive token from the prune job's pod
// template (same image, config, Secrets and security context).
func RedriveJob(idc *messagingv1alpha1.IdempotentConsumer, rc *RuntimeConfig, image, secretsHash, token, reason string, ids []string) *batchv1.Job {
	args := append(configArgs("redrive"), "--run", token)
	if reason != "" {
		args = append(args, "--reason", reason)
	}
	for _, id := range ids {
		args = append(args, "--id", id)
	}
	container := corev1.Container{Name: ComponentRedrive, Command: []string{runtimeBinary}, Args: args}
	spec := podSpec(idc, image, rc, container)
	// Redrive is safe to repeat: a failed pod is retried by the Job.
	spec.RestartPolicy = corev1.RestartPolicyOnFailure
	l := Labels(idc, ComponentRedrive)
	l[LabelRedriveToken] = TokenHash(token)
	return &batchv1.Job{
		TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: RedriveJobName(idc, token), Namespace: idc.Namespace, Labels: l,
			Annotations: map[string]string{messagingv1alpha1.AnnotationRedrive: token}},
		Spec: batchv1.JobSpec{
			BackoffLimit:            ptr.To(int32(3)),
			TTLSecondsAfterFinished: ptr.To(int32(86400)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: l, Annotations: podAnnotations(idc, rc, secretsHash)},
				Spec:       spec,
			},
		},
	}
}
