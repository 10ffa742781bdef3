package specs

import (
	"crypto/sha256"
	"encoding/hex"

	"k8s.io/apimachinery/pkg/labels"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// LabelManagedBy is the label every rendered child carries, with value
// ManagedBy; the manager caches only the children that carry it.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "idc-operator"
)

// The components a child belongs to (app.kubernetes.io/component).
const (
	ComponentConsumer = "consumer"
	ComponentPrune    = "prune"
	ComponentRedrive  = "redrive"
)

// LabelRedriveToken carries a hash of the redrive token (label values are
// short and restricted); the token itself is an annotation of the Job.
const LabelRedriveToken = "messaging.idempotency.dev/redrive-token-hash"

// maxJobName keeps the Job's name usable as the job-name label of its pods.
const maxJobName = 63

// Labels are the labels of a child of the given component.
func Labels(idc *messagingv1alpha1.IdempotentConsumer, component string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":      "idc-runtime",
		"app.kubernetes.io/instance":  idc.Name,
		"app.kubernetes.io/component": component,
		LabelManagedBy:                ManagedBy,
	}
}

// DeploymentName is the consumer Deployment's name, also that of its
// PodDisruptionBudget, NetworkPolicy and ScaledObject.
func DeploymentName(idc *messagingv1alpha1.IdempotentConsumer) string { return idc.Name }

// ConfigMapName is the runtime config's ConfigMap.
func ConfigMapName(idc *messagingv1alpha1.IdempotentConsumer) string { return idc.Name + "-runtime" }

// CronJobName is the prune CronJob's name.
func CronJobName(idc *messagingv1alpha1.IdempotentConsumer) string { return idc.Name + "-prune" }

// TriggerAuthName is the TriggerAuthentication's name; the ScaledObject
// bears the Deployment's.
func TriggerAuthName(idc *messagingv1alpha1.IdempotentConsumer) string {
	return DeploymentName(idc) + "-keda"
}

// ConsumerSelector is the consumer pods' label selector (what the
// Deployment selects, without the managed-by label).
func ConsumerSelector(idc *messagingv1alpha1.IdempotentConsumer) map[string]string {
	l := Labels(idc, ComponentConsumer)
	delete(l, LabelManagedBy)
	return l
}

// Selector is the consumer pods' selector as a string, published for
// /scale.
func Selector(idc *messagingv1alpha1.IdempotentConsumer) string {
	return labels.SelectorFromSet(ConsumerSelector(idc)).String()
}

// TokenHash is the redrive token's hash in the LabelRedriveToken label.
func TokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])[:10]
}

// RedriveJobName is <name>-redrive-<hash of the token>, the name cut so
// the whole stays within 63 characters.
func RedriveJobName(idc *messagingv1alpha1.IdempotentConsumer, token string) string {
	suffix := "-redrive-" + TokenHash(token)
	name := idc.Name
	if len(name)+len(suffix) > maxJobName {
		name = name[:maxJobName-len(suffix)]
	}
	return name + suffix
}
