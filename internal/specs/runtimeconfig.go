package specs

import (
	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const (
	// AnnotationConfigHash on the pod template rolls the pods when the runtime
	// config changes.
	AnnotationConfigHash = "messaging.idempotency.dev/config-hash"
	// AnnotationSecretsHash on the pod template rolls the pods when a
	// referenced Secret's data changes.
	AnnotationSecretsHash = "messaging.idempotency.dev/secrets-hash"

	// ConfigKey is the runtime config's key in its ConfigMap, mounted at
	// ConfigMountPath.
	ConfigKey       = "config.json"
	ConfigMountPath = "/etc/idc"
	runtimeBinary   = "/idc-runtime"

	// HealthPort is the runtime's metrics and health port.
	HealthPort = 8080
)

// SecretEnv is one credential: the env var the runtime reads and the
// Secret key it comes from.
type SecretEnv struct {
	Env string
	Ref messagingv1alpha1.SecretKeyRef
}

// RuntimeConfig is the rendered runtime configuration and the credentials
// it needs, as the children carry them.
type RuntimeConfig struct {
	Config  *config.Config
	Secrets []SecretEnv
	// JSON is the config as the pod reads it; Hash rolls the pods on change.
	JSON []byte
	Hash string
}
