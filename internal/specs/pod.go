package specs

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// secretEnvVars maps every credential to a secretKeyRef env var. Values never
// pass through the operator into the pod spec.
func secretEnvVars(rc *RuntimeConfig) []corev1.EnvVar {
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

// podSpec is shared by the consumer Deployment, the prune CronJob and the
// redrive Job.
func podSpec(idc *messagingv1alpha1.IdempotentConsumer, image string, rc *RuntimeConfig, container corev1.Container) corev1.PodSpec {
	container.Image = image
	container.ImagePullPolicy = corev1.PullIfNotPresent
	container.Env = append(secretEnvVars(rc), corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"},
	}})
	container.VolumeMounts = []corev1.VolumeMount{
		{Name: "config", MountPath: ConfigMountPath, ReadOnly: true},
		{Name: "tmp", MountPath: "/tmp"},
	}
	container.SecurityContext = restrictedContainerSecurityContext()
	container.Resources = RuntimeResources(idc.Spec.Runtime.Resources)
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
				LocalObjectReference: corev1.LocalObjectReference{Name: ConfigMapName(idc)},
			}}},
			{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(tmpSizeLimit)}}},
		},
	}
	placePods(idc, &spec)
	return spec
}

// configArgs are the runtime's arguments that name its config file.
func configArgs(command string) []string {
	return []string{command, "--config", ConfigMountPath + "/" + ConfigKey}
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

// RuntimeResources is spec.runtime.resources with defaultRequests filled in
// for each resource that has neither a request nor a limit (Kubernetes
// copies a limit into a missing request, and a default above it would be
// refused).
func RuntimeResources(in corev1.ResourceRequirements) corev1.ResourceRequirements {
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
	spec.NodeSelector = CoreNodeSelector(rt.NodeSelector)
	spec.Affinity = CoreAffinity(rt.Affinity)
	spec.Tolerations = CoreTolerations(rt.Tolerations)
	spec.TopologySpreadConstraints = rt.TopologySpreadConstraints
	spec.PriorityClassName = rt.PriorityClassName
}

func podAnnotations(idc *messagingv1alpha1.IdempotentConsumer, rc *RuntimeConfig, secretsHash string) map[string]string {
	out := map[string]string{}
	for k, v := range idc.Spec.Runtime.PodAnnotations {
		out[k] = v
	}
	out[AnnotationConfigHash] = rc.Hash
	out[AnnotationSecretsHash] = secretsHash
	return out
}
