package controllers

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

const (
	// AnnotationConfigHash on the pod template rolls the pods when the runtime
	// config changes.
	AnnotationConfigHash = "messaging.idempotency.dev/config-hash"
	// AnnotationSecretsHash on the pod template rolls the pods when a
	// referenced Secret's data changes.
	AnnotationSecretsHash = "messaging.idempotency.dev/secrets-hash"

	configKey       = "config.json"
	configMountPath = "/etc/idc"
	runtimeBinary   = "/idc-runtime"

	componentConsumer = "consumer"
	componentPrune    = "prune"
)

func labelsFor(idc *messagingv1alpha1.IdempotentConsumer, component string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "idc-runtime",
		"app.kubernetes.io/instance":   idc.Name,
		"app.kubernetes.io/component":  component,
		"app.kubernetes.io/managed-by": "idc-operator",
	}
}

func deploymentName(idc *messagingv1alpha1.IdempotentConsumer) string { return idc.Name }
func configMapName(idc *messagingv1alpha1.IdempotentConsumer) string  { return idc.Name + "-runtime" }

// selectorFor is the consumer pods' selector, also published for /scale.
func selectorFor(idc *messagingv1alpha1.IdempotentConsumer) string {
	l := labelsFor(idc, componentConsumer)
	delete(l, "app.kubernetes.io/managed-by")
	return labels.SelectorFromSet(l).String()
}

func renderConfigMap(idc *messagingv1alpha1.IdempotentConsumer, rc *renderedConfig) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: configMapName(idc), Namespace: idc.Namespace, Labels: labelsFor(idc, componentConsumer)},
		Data:       map[string]string{configKey: string(rc.JSON)},
	}
}

// secretEnvVars maps every credential to a secretKeyRef env var. Values never
// pass through the operator into the pod spec.
func secretEnvVars(rc *renderedConfig) []corev1.EnvVar {
	out := make([]corev1.EnvVar, 0, len(rc.Secrets))
	for _, s := range rc.Secrets {
		out = append(out, corev1.EnvVar{Name: s.Env, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: s.Ref.Name}, Key: s.Ref.Key,
		}}})
	}
	return out
}

func restrictedContainerSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		RunAsNonRoot:             ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

// podSpec is shared by the consumer Deployment and the prune CronJob.
func podSpec(idc *messagingv1alpha1.IdempotentConsumer, image string, rc *renderedConfig, container corev1.Container) corev1.PodSpec {
	container.Image = image
	container.ImagePullPolicy = corev1.PullIfNotPresent
	container.Env = append(secretEnvVars(rc), corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"},
	}})
	container.VolumeMounts = []corev1.VolumeMount{
		{Name: "config", MountPath: configMountPath, ReadOnly: true},
		{Name: "tmp", MountPath: "/tmp"},
	}
	container.SecurityContext = restrictedContainerSecurityContext()
	container.Resources = runtimeResources(idc.Spec.Runtime.Resources)
	spec := corev1.PodSpec{
		ServiceAccountName:           idc.Spec.Runtime.ServiceAccountName,
		AutomountServiceAccountToken: ptr.To(false),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot:   ptr.To(true),
			RunAsUser:      ptr.To(int64(65532)),
			RunAsGroup:     ptr.To(int64(65532)),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{container},
		Volumes: []corev1.Volume{
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: configMapName(idc)},
			}}},
			{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(tmpSizeLimit)}}},
		},
	}
	placePods(idc, &spec)
	return spec
}

// defaultRequests are the runtime container's requests for cpu and memory
// when spec.runtime.resources names neither a request nor a limit for
// them: a pod without requests is the first evicted and may land on a node
// with nothing left for it.
var defaultRequests = corev1.ResourceList{
	corev1.ResourceCPU:    resource.MustParse("100m"),
	corev1.ResourceMemory: resource.MustParse("128Mi"),
	// /tmp (tmpSizeLimit) and the container's logs: scheduled against the
	// node's disk like cpu and memory, evicted first when it runs short.
	corev1.ResourceEphemeralStorage: resource.MustParse("128Mi"),
}

// ephemeralStorageLimit is the runtime container's ephemeral-storage limit
// when spec.runtime.resources names neither a request nor a limit for it.
var ephemeralStorageLimit = resource.MustParse("1Gi")

// tmpSizeLimit bounds the /tmp scratch volume: the runtime writes little
// there, and a runaway write must evict the pod, not fill the node's disk.
var tmpSizeLimit = resource.MustParse("64Mi")

// runtimeResources is spec.runtime.resources with defaultRequests filled in
// for each resource that has neither a request nor a limit (Kubernetes
// copies a limit into a missing request, and a default above it would be
// refused).
func runtimeResources(in corev1.ResourceRequirements) corev1.ResourceRequirements {
	out := *in.DeepCopy()
	for name, q := range defaultRequests {
		if _, ok := out.Requests[name]; ok {
			continue
		}
		if _, ok := out.Limits[name]; ok {
			continue
		}
		if out.Requests == nil {
			out.Requests = corev1.ResourceList{}
		}
		out.Requests[name] = q.DeepCopy()
	}
	// Ephemeral storage gets a limit too when the spec names none: a pod
	// that fills the node's disk is evicted, not the node's other pods.
	_, req := in.Requests[corev1.ResourceEphemeralStorage]
	if _, lim := in.Limits[corev1.ResourceEphemeralStorage]; !req && !lim {
		if out.Limits == nil {
			out.Limits = corev1.ResourceList{}
		}
		out.Limits[corev1.ResourceEphemeralStorage] = ephemeralStorageLimit.DeepCopy()
	}
	return out
}

// placePods passes spec.runtime's placement (nodeSelector, affinity,
// tolerations, topologySpreadConstraints, priorityClassName) through to a
// pod spec: the consumer Deployment's, the prune CronJob's and the redrive
// Job's pods are all placed alike.
func placePods(idc *messagingv1alpha1.IdempotentConsumer, spec *corev1.PodSpec) {
	rt := idc.Spec.Runtime
	spec.NodeSelector = coreNodeSelector(rt.NodeSelector)
	spec.Affinity = coreAffinity(rt.Affinity)
	spec.Tolerations = coreTolerations(rt.Tolerations)
	spec.TopologySpreadConstraints = rt.TopologySpreadConstraints
	spec.PriorityClassName = rt.PriorityClassName
}

func podAnnotations(idc *messagingv1alpha1.IdempotentConsumer, rc *renderedConfig, secretsHash string) map[string]string {
	out := map[string]string{}
	for k, v := range idc.Spec.Runtime.PodAnnotations {
		out[k] = v
	}
	out[AnnotationConfigHash] = rc.Hash
	out[AnnotationSecretsHash] = secretsHash
	return out
}

// desiredReplicas is 0 while suspended, else spec.runtime.replicas.
func desiredReplicas(idc *messagingv1alpha1.IdempotentConsumer) int32 {
	if idc.Spec.Suspend {
		return 0
	}
	if idc.Spec.Runtime.Replicas == nil {
		return 1
	}
	return *idc.Spec.Runtime.Replicas
}

func runtimeImageFor(idc *messagingv1alpha1.IdempotentConsumer, defaultImage string) string {
	if idc.Spec.Runtime.Image != "" {
		return idc.Spec.Runtime.Image
	}
	return defaultImage
}

// renderDeployment renders the consumer Deployment.
func renderDeployment(idc *messagingv1alpha1.IdempotentConsumer, rc *renderedConfig, image, secretsHash string) *appsv1.Deployment {
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("metrics")}},
			PeriodSeconds: 10, FailureThreshold: 3,
		}
	}
	container := corev1.Container{
		Name:           "runtime",
		Command:        []string{runtimeBinary},
		Args:           []string{"run", "--config", configMountPath + "/" + configKey},
		Ports:          []corev1.ContainerPort{{Name: "metrics", ContainerPort: healthPort, Protocol: corev1.ProtocolTCP}},
		LivenessProbe:  probe("/healthz"),
		ReadinessProbe: probe("/readyz"),
	}
	l := labelsFor(idc, componentConsumer)
	selector := labelsFor(idc, componentConsumer)
	delete(selector, "app.kubernetes.io/managed-by")
	spec := podSpec(idc, image, rc, container)
	if len(spec.TopologySpreadConstraints) == 0 {
		spec.TopologySpreadConstraints = defaultTopologySpread(idc)
	}
	// A graceful stop finishes the batch in flight before exiting.
	spec.TerminationGracePeriodSeconds = ptr.To(int64(30))
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: deploymentName(idc), Namespace: idc.Namespace, Labels: l},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(desiredReplicas(idc)),
			Selector: &metav1.LabelSelector{MatchLabels: selector},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: l, Annotations: podAnnotations(idc, rc, secretsHash)},
				Spec:       spec,
			},
		},
	}
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
