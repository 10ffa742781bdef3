package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Condition types. Ready summarises the others; Reconciling and Stalled follow
// kstatus so Flux and Argo CD read progress and failure without custom checks.
const (
	// ConditionReady is True when the inbox is provisioned, the runtime is
	// available, and pruning is scheduled (or deliberately suspended).
	ConditionReady = "Ready"
	// ConditionInboxReady is True when the inbox, dead-letter and prune-run
	// tables exist at the expected schema version.
	ConditionInboxReady = "InboxReady"
	// ConditionEffectReady is True when the sink database can take the
	// effect: the table, every mapped column (of an assignable type), a
	// unique key for an upsert, an integer sequence column, the privileges,
	// or an sql statement that prepares with its declared parameters. While
	// it is False the runtime is held at 0 replicas.
	ConditionEffectReady = "EffectReady"
	// ConditionRuntimeReady is True when the consumer Deployment is Available
	// (or suspended on purpose).
	ConditionRuntimeReady = "RuntimeReady"
	// ConditionPruneScheduled is True when the prune CronJob is active.
	ConditionPruneScheduled = "PruneScheduled"
	// ConditionRetentionResolved is True when the retention window is known.
	ConditionRetentionResolved = "RetentionResolved"
	// ConditionReconciling is True while the controller is converging.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when progress needs a human, with a message
	// that says what to run: a missing privilege, table, column or unique
	// key, a statement or connection string that is wrong (also in
	// EffectReady or InboxReady), an invalid spec, a conflict, an unbounded
	// replay. A database or broker that cannot be reached is not Stalled: it
	// is re-checked every --recheck-period while Reconciling.
	ConditionStalled = "Stalled"
)

// Condition reasons, CamelCase as Kubernetes expects.
const (
	ReasonReady              = "Ready"
	ReasonProvisioned        = "Provisioned"
	ReasonProgressing        = "Progressing"
	ReasonSuspended          = "Suspended"
	ReasonSecretNotFound     = "SecretNotFound"
	ReasonSecretKeyMissing   = "SecretKeyMissing"
	ReasonInvalidDSN         = "InvalidDSN"
	ReasonDatabaseError      = "DatabaseUnreachable"
	ReasonProvisioningFailed = "ProvisioningFailed"
	ReasonPermissionDenied   = "PermissionDenied"
	ReasonConflict           = "Conflict"
	ReasonDeploymentNotReady = "DeploymentNotAvailable"
	ReasonScheduled          = "Scheduled"
	ReasonPruneSuspended     = "PruneSuspended"
	// ReasonPruneHeldBack (PruneScheduled and Ready, both True): the last
	// prune run kept ids its window would have deleted, because a replica
	// stopped with claims the broker may still redeliver; it lasts until
	// the broker shows them settled (docs/design.md, "The retention window").
	ReasonPruneHeldBack     = "PruneHeldBack"
	ReasonBrokerValues      = "Broker"
	ReasonExplicit          = "Explicit"
	ReasonUnboundedReplay   = "UnboundedReplay"
	ReasonBrokerUnreachable = "BrokerUnreachable"
	// ReasonStreamNotPartitioned: natsJetStream.partitions is set and the
	// stream does not partition its subjects that way (or the server is
	// older than 2.10); the message says what to change.
	ReasonStreamNotPartitioned = "StreamNotPartitioned"
	ReasonWaitingForInbox      = "WaitingForInbox"
	ReasonWaitingForWindow     = "WaitingForRetention"
	ReasonInvalidSpec          = "InvalidSpec"
	// ReasonInboxRetained (InboxReady=False, with a Warning event): a
	// deletion with deletionPolicy Delete left the inbox tables in place
	// because they could not be dropped (the spec no longer renders, the
	// Secret is gone, the database stayed unreachable past --drop-timeout).
	ReasonInboxRetained = "InboxRetained"
	// ReasonImageNotAllowed (Stalled): spec.runtime.image names an image
	// the manager's --allowed-runtime-images does not list; nothing is
	// deployed with it.
	ReasonImageNotAllowed = "ImageNotAllowed"
	// ReasonMigrationQueued (InboxReady=False, Reconciling): the inbox
	// migration waited its bound for one of the migrations the manager
	// runs at once on one database (other inboxes held them all) and runs
	// on the next check. The database is reachable; nothing is wrong.
	ReasonMigrationQueued = "MigrationQueued"
	// ReasonAuthenticationFailed (InboxReady=False, Stalled): the sink
	// database refused the credentials of the connection Secret (SQLSTATE
	// class 28: wrong user or password, no pg_hba entry). A person must fix
	// the Secret or the role; no grant helps.
	ReasonAuthenticationFailed = "AuthenticationFailed"

	// EffectReady=False reasons (the sink is not ready for the effect).
	ReasonTableNotFound      = "TableNotFound"
	ReasonColumnNotFound     = "ColumnNotFound"
	ReasonColumnTypeMismatch = "ColumnTypeMismatch"
	ReasonNoUniqueKey        = "NoUniqueKey"
	ReasonStatementInvalid   = "StatementInvalid"
	// ReasonWaitingForEffect: RuntimeReady=False while the Deployment is
	// held at 0 replicas because EffectReady is False.
	ReasonWaitingForEffect = "WaitingForEffect"
)

// The BrokerLimits condition: True when the broker-side consumer limits can
// fill every declared replica's in-flight batches (replicas x batchSize x
// inFlight unacknowledged messages), False with reason BrokerLimitTooSmall
// when an existing consumer caps throughput below that. It does not make
// the resource unready: the consumer works, only slower.
const (
	ConditionBrokerLimits     = "BrokerLimits"
	ReasonLimitsFit           = "LimitsFit"
	ReasonBrokerLimitTooSmall = "BrokerLimitTooSmall"
)

// The Autoscaling condition, present only while spec.runtime.autoscaling is
// set: True with reason ScaledByKEDA when KEDA reports the ScaledObject
// Ready; False with KEDANotInstalled (the Deployment runs
// max(minReplicas, 1) replicas), ScaledObjectNotReady (KEDA's own message)
// or InvalidSpec (a source KEDA's scaler cannot be given). It does not make
// the resource unready: the consumer works at a fixed scale.
const (
	ConditionAutoscaling       = "Autoscaling"
	ReasonScaledByKEDA         = "ScaledByKEDA"
	ReasonKEDANotInstalled     = "KEDANotInstalled"
	ReasonScaledObjectNotReady = "ScaledObjectNotReady"
)

// Guarantee is what the consumer promises for its effect.
// +kubebuilder:validation:Enum=ExactlyOnceEffect;AtLeastOnceWithIdempotencyKey
type Guarantee string

const (
	// GuaranteeExactlyOnceEffect: the effect commits with the inbox claim.
	GuaranteeExactlyOnceEffect Guarantee = "ExactlyOnceEffect"
	// GuaranteeAtLeastOnceWithIdempotencyKey: the http effect is called at
	// least once with Idempotency-Key; the remote side deduplicates.
	GuaranteeAtLeastOnceWithIdempotencyKey Guarantee = "AtLeastOnceWithIdempotencyKey"
)

// IdempotentConsumerStatus is the observed state.
type IdempotentConsumerStatus struct {
	// observedGeneration is the generation of the last successful reconcile.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// conditions: Ready, InboxReady, RuntimeReady, PruneScheduled,
	// RetentionResolved, Reconciling, Stalled.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// source names the broker and its stream, topic or queue.
	// +optional
	Source string `json:"source,omitempty"`
	// guarantee is ExactlyOnceEffect or AtLeastOnceWithIdempotencyKey (http).
	// +optional
	Guarantee Guarantee `json:"guarantee,omitempty"`
	// retention is the window in force and how it was derived.
	// +optional
	Retention *RetentionStatus `json:"retention,omitempty"`
	// inbox is the provisioned table.
	// +optional
	Inbox *InboxStatus `json:"inbox,omitempty"`
	// runtime is the consumer Deployment.
	// +optional
	Runtime *RuntimeStatus `json:"runtime,omitempty"`
	// lastPrune is the latest prune run recorded in the database.
	// +optional
	LastPrune *PruneRunStatus `json:"lastPrune,omitempty"`
	// lag is the broker's backlog for this consumer (JetStream
	// num_pending+num_ack_pending, Kafka partition lag, RabbitMQ
	// ready+unacked, Redis XINFO GROUPS lag), read at each retention pass
	// but written only when it crosses a power of ten (buckets 0, 1-9,
	// 10-99, 100-999, ...; the value of the read that moved it there): a
	// backlog that moves with traffic does not rewrite status at every
	// read. It gives the order of magnitude; the exact figure at every
	// read is the manager's idc_resource_lag_messages gauge.
	// +optional
	Lag *int64 `json:"lag,omitempty"`
	// partitions is each partition's Deployment, durable consumer,
	// replicas and lag (spec.source.natsJetStream.partitions); lag and
	// status.runtime then add up the partitions.
	// +optional
	// +listType=map
	// +listMapKey=partition
	Partitions []PartitionStatus `json:"partitions,omitempty"`
	// lastRedrive is the latest redrive run through the
	// messaging.idempotency.dev/redrive annotation.
	// +optional
	LastRedrive *RedriveRunStatus `json:"lastRedrive,omitempty"`
	// outbox is the backlog of the transactional outbox (only with
	// spec.emit), read at each retention pass.
	// +optional
	Outbox *OutboxStatus `json:"outbox,omitempty"`
}

// OutboxStatus is the relay's backlog: events committed and not yet
// confirmed by the emit target.
type OutboxStatus struct {
	// pending counts the unsent rows of <inbox>_outbox.
	Pending int64 `json:"pending"`
	// oldestAge is the age of the oldest unsent row (0s when none).
	OldestAge metav1.Duration `json:"oldestAge"`
}

// RetentionSourceKind says where the window's inputs came from.
// +kubebuilder:validation:Enum=Broker;Declared
type RetentionSourceKind string

const (
	// RetentionSourceBroker: read live from the broker.
	RetentionSourceBroker RetentionSourceKind = "Broker"
	// RetentionSourceDeclared: taken from the spec.
	RetentionSourceDeclared RetentionSourceKind = "Declared"
)

// RetentionStatus is the window in force.
type RetentionStatus struct {
	// window is the retention of processed ids.
	// +optional
	Window string `json:"window,omitempty"`
	// redeliveryHorizon = min(L, A + O).
	// +optional
	RedeliveryHorizon string `json:"redeliveryHorizon,omitempty"`
	// replayHorizon is how far back a replay can reach.
	// +optional
	ReplayHorizon string `json:"replayHorizon,omitempty"`
	// source of the inputs.
	// +optional
	Source RetentionSourceKind `json:"source,omitempty"`
	// derivedFrom lists every input and where it came from.
	// +optional
	DerivedFrom string `json:"derivedFrom,omitempty"`
	// observedAt is when the broker first reported the inputs as they are
	// now. The broker is read every --retention-period; a read that finds
	// the same inputs leaves observedAt (and so the status) unchanged.
	// +optional
	ObservedAt *metav1.Time `json:"observedAt,omitempty"`
	// inputsHash identifies the inputs.
	// +optional
	InputsHash string `json:"inputsHash,omitempty"`
	// pendingWindow is a smaller window derived from the broker; it is adopted
	// once the current window has elapsed since pendingSince, because ids
	// processed under the old window may still be redelivered until then.
	// +optional
	PendingWindow string `json:"pendingWindow,omitempty"`
	// pendingSince is when pendingWindow was first derived.
	// +optional
	PendingSince *metav1.Time `json:"pendingSince,omitempty"`
}

// InboxStatus is the provisioned inbox.
type InboxStatus struct {
	// table is schema-qualified.
	// +optional
	Table string `json:"table,omitempty"`
	// layout of the table.
	// +optional
	Layout InboxLayout `json:"layout,omitempty"`
	// schemaVersion of the inbox tables.
	// +optional
	SchemaVersion int32 `json:"schemaVersion,omitempty"`
	// epoch is the generation of the inbox's dedup state, minted when the
	// inbox was created and recorded in its meta row. An inbox that no
	// longer holds it (dropped, truncated, re-created) is InboxLost.
	// +optional
	Epoch string `json:"epoch,omitempty"`
	// database is the physical database the inbox is in, as PostgreSQL
	// reports it: its system identifier and the database name.
	// +optional
	Database string `json:"database,omitempty"`
}

// RuntimeStatus is the consumer Deployment.
type RuntimeStatus struct {
	// deployment name.
	// +optional
	Deployment string `json:"deployment,omitempty"`
	// replicas observed (the /scale status).
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// readyReplicas observed.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// selector of the pods, for /scale and HPA.
	// +optional
	Selector string `json:"selector,omitempty"`
	// desiredReplicas is the Deployment's replica count as last read:
	// spec.runtime.replicas, or what KEDA decided under autoscaling.
	// +optional
	DesiredReplicas *int32 `json:"desiredReplicas,omitempty"`
	// scaleReason says who sets the replicas and why (spec.runtime.replicas;
	// KEDA with the backlog per replica it read; KEDA not installed).
	// +optional
	ScaleReason string `json:"scaleReason,omitempty"`
	// scaledObject is the KEDA ScaledObject that scales the Deployment,
	// while spec.runtime.autoscaling is set and KEDA is installed.
	// +optional
	ScaledObject string `json:"scaledObject,omitempty"`
}

// PartitionStatus is one partition of a partitioned consumer.
type PartitionStatus struct {
	// partition is the index, 0 to partitions-1.
	Partition int32 `json:"partition"`
	// deployment runs the partition's replicas.
	// +optional
	Deployment string `json:"deployment,omitempty"`
	// consumer is the partition's durable consumer on the stream.
	// +optional
	Consumer string `json:"consumer,omitempty"`
	// replicas observed.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`
	// readyReplicas observed.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// lag is the partition's backlog, in power-of-ten buckets like
	// status.lag (idc_resource_partition_lag_messages has every read).
	// +optional
	Lag *int64 `json:"lag,omitempty"`
	// ready says the partition's Deployment is available.
	// +optional
	Ready bool `json:"ready,omitempty"`
}

// PruneRunStatus is one prune run.
type PruneRunStatus struct {
	// time the run finished.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
	// cutoff: rows processed before it were eligible.
	// +optional
	Cutoff *metav1.Time `json:"cutoff,omitempty"`
	// rowsDeleted by the run.
	// +optional
	RowsDeleted int64 `json:"rowsDeleted,omitempty"`
	// partitionsDropped by the run.
	// +optional
	PartitionsDropped int32 `json:"partitionsDropped,omitempty"`
	// windowCutoff is the run's time minus the window: what the window
	// alone would have let it delete below. cutoff is earlier when the
	// consumer's progress held the run back.
	// +optional
	WindowCutoff *metav1.Time `json:"windowCutoff,omitempty"`
	// heldBack says why the run kept ids the window would have deleted: a
	// replica stopped with claims committed and not acknowledged, which the
	// broker may still redeliver. Empty when the run was not held back.
	// +optional
	HeldBack string `json:"heldBack,omitempty"`
	// heldSince is when the hold began (the holding replica's last
	// progress, or its oldest unacknowledged claim).
	// +optional
	HeldSince *metav1.Time `json:"heldSince,omitempty"`
}
