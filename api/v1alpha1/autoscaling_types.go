package v1alpha1

// MinReplicasOrDefault is minReplicas, 1 when unset.
func (a *AutoscalingSpec) MinReplicasOrDefault() int32 {
	if a.MinReplicas == nil {
		return 1
	}
	return *a.MinReplicas
}

// AutoscalingSpec scales the consumer Deployment on the broker's backlog
// with KEDA: the controller renders a KEDA ScaledObject (the scaler that
// matches the source kind, built from the same source spec) and a
// TriggerAuthentication that references the source's own Secrets. While it
// is set, KEDA's HorizontalPodAutoscaler owns the Deployment's replicas and
// the broker-side limits are sized for maxReplicas. Without KEDA installed
// the condition Autoscaling says KEDANotInstalled and the Deployment runs
// max(minReplicas, 1) replicas.
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",message="minReplicas must not exceed maxReplicas",fieldPath=".minReplicas"
// +kubebuilder:validation:XValidation:rule="!has(self.pollingInterval) || duration(self.pollingInterval) >= duration('1s')",message="pollingInterval must be at least 1s (KEDA polls in whole seconds)",fieldPath=".pollingInterval"
// +kubebuilder:validation:XValidation:rule="!has(self.cooldownPeriod) || duration(self.cooldownPeriod) <= duration('24h')",message="cooldownPeriod must be between 0s and 24h",fieldPath=".cooldownPeriod"
// +kubebuilder:validation:XValidation:rule="!has(self.scaleDownStabilization) || duration(self.scaleDownStabilization) <= duration('1h')",message="scaleDownStabilization must be at most 1h (the HorizontalPodAutoscaler's limit)",fieldPath=".scaleDownStabilization"
type AutoscalingSpec struct {
	// minReplicas the consumer keeps while the backlog is at or below
	// activationLag. 0 lets an idle consumer go away entirely: KEDA wakes it
	// (0 -> 1) when the backlog passes activationLag, after at most one
	// pollingInterval, and takes it back to 0 cooldownPeriod after the last
	// backlog it saw.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	MinReplicas *int32 `json:"minReplicas,omitempty"`
	// maxReplicas the consumer may reach. Broker-side limits (JetStream
	// MaxAckPending) and the BrokerLimits condition are sized for it.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +required
	MaxReplicas int32 `json:"maxReplicas"`
	// lagPerReplica is the backlog one replica is expected to hold: KEDA
	// asks for ceil(backlog / lagPerReplica) replicas, between minReplicas
	// and maxReplicas. Default: delivery.batchSize x delivery.inFlight (what
	// one fetch of one replica takes).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000000
	// +optional
	LagPerReplica *int64 `json:"lagPerReplica,omitempty"`
	// activationLag is the backlog above which the consumer is active: at
	// minReplicas 0, a backlog above it wakes the consumer.
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000000
	// +optional
	ActivationLag int64 `json:"activationLag,omitempty"`
	// pollingInterval is how often KEDA reads the backlog (whole seconds).
	// +kubebuilder:default="30s"
	// +optional
	PollingInterval Duration `json:"pollingInterval,omitempty"`
	// cooldownPeriod is how long KEDA waits after the last active reading
	// before it scales to 0 (minReplicas 0 only).
	// +kubebuilder:default="5m"
	// +optional
	CooldownPeriod Duration `json:"cooldownPeriod,omitempty"`
	// scaleDownStabilization is the HorizontalPodAutoscaler's scale-down
	// stabilization window: it scales down to the highest recommendation of
	// this window, so a backlog that comes in waves does not make replicas
	// come and go.
	// +kubebuilder:default="5m"
	// +optional
	ScaleDownStabilization Duration `json:"scaleDownStabilization,omitempty"`
	// natsMonitoringURL is the NATS server's monitoring endpoint KEDA reads
	// the consumer's backlog from (/jsz), e.g. http://nats:8222. Default:
	// the host of source.natsJetStream.url on port 8222 (https when the
	// source uses tls). natsJetStream sources only.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.matches('^https?://[^/?#@]+/?$')",message="natsMonitoringURL must be http(s)://host[:port], without credentials or a path"
	// +optional
	NATSMonitoringURL string `json:"natsMonitoringURL,omitempty"`
	// natsAccount is the NATS account of the stream, as the monitoring
	// endpoint names it. natsJetStream sources only.
	// +kubebuilder:default="$G"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +optional
	NATSAccount string `json:"natsAccount,omitempty"`
}
