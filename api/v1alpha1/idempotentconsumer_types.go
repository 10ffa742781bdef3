package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IdempotentConsumer turns at-least-once delivery from a broker into an
// exactly-once effect in PostgreSQL or MySQL/MariaDB. The controller provisions the inbox
// tables, deploys the runtime consumer, derives the dedup retention window from
// the broker and runs a prune CronJob with that window.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.runtime.replicas,statuspath=.status.runtime.replicas,selectorpath=.status.runtime.selector
// +kubebuilder:resource:shortName=idc,categories=messaging
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="Whether the consumer is provisioned, running and pruning"
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.status.source`,description="The broker the consumer reads"
// +kubebuilder:printcolumn:name="Window",type=string,JSONPath=`.status.retention.window`,description="The dedup retention window in force"
// +kubebuilder:printcolumn:name="Last Prune",type=date,JSONPath=`.status.lastPrune.time`,description="When the inbox was last pruned"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Guarantee",type=string,JSONPath=`.status.guarantee`,priority=1
// +kubebuilder:printcolumn:name="Lag",type=integer,JSONPath=`.status.lag`,priority=1,description="The broker's backlog for this consumer, rewritten when it crosses a power of ten"
type IdempotentConsumer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec declares the source, the sink and its effect, and the retention policy.
	// +required
	Spec IdempotentConsumerSpec `json:"spec"`

	// status is observed by the controller.
	// +optional
	Status IdempotentConsumerStatus `json:"status,omitempty"`
}

// IdempotentConsumerSpec is the desired state of an IdempotentConsumer.
// +kubebuilder:validation:XValidation:rule="!has(self.sink.effect.upsert) || !((self.sink.effect.upsert.table == self.sink.inbox.table || self.sink.effect.upsert.table.startsWith(self.sink.inbox.table + '_') || (size(self.sink.inbox.table) > (has(self.sink.mysql) ? 42 : 41) && size(self.sink.effect.upsert.table) == (has(self.sink.mysql) ? 64 : 63) && self.sink.effect.upsert.table.startsWith(self.sink.inbox.table.substring(0, (has(self.sink.mysql) ? 42 : 41))) && self.sink.effect.upsert.table.substring((has(self.sink.mysql) ? 42 : 41)).matches('^[a-z0-9_]{0,12}_[0-9a-f]{8}_'))) || (has(self.delivery) && has(self.delivery.deadLetter) && self.sink.effect.upsert.table == self.delivery.deadLetter.table))",message="the effect table must not be the inbox table or the dead-letter table, nor any other <inbox>_* name: the operator reserves them for the inbox's own tables and partitions",fieldPath=".sink.effect.upsert.table"
// +kubebuilder:validation:XValidation:rule="!has(self.sink.effect.append) || !((self.sink.effect.append.table == self.sink.inbox.table || self.sink.effect.append.table.startsWith(self.sink.inbox.table + '_') || (size(self.sink.inbox.table) > (has(self.sink.mysql) ? 42 : 41) && size(self.sink.effect.append.table) == (has(self.sink.mysql) ? 64 : 63) && self.sink.effect.append.table.startsWith(self.sink.inbox.table.substring(0, (has(self.sink.mysql) ? 42 : 41))) && self.sink.effect.append.table.substring((has(self.sink.mysql) ? 42 : 41)).matches('^[a-z0-9_]{0,12}_[0-9a-f]{8}_'))) || (has(self.delivery) && has(self.delivery.deadLetter) && self.sink.effect.append.table == self.delivery.deadLetter.table))",message="the effect table must not be the inbox table or the dead-letter table, nor any other <inbox>_* name: the operator reserves them for the inbox's own tables and partitions",fieldPath=".sink.effect.append.table"
// +kubebuilder:validation:XValidation:rule="!has(self.delivery) || !has(self.delivery.deadLetter) || !(self.delivery.deadLetter.table == self.sink.inbox.table || self.delivery.deadLetter.table.startsWith(self.sink.inbox.table + '_') || (size(self.sink.inbox.table) > (has(self.sink.mysql) ? 42 : 41) && size(self.delivery.deadLetter.table) == (has(self.sink.mysql) ? 64 : 63) && self.delivery.deadLetter.table.startsWith(self.sink.inbox.table.substring(0, (has(self.sink.mysql) ? 42 : 41))) && self.delivery.deadLetter.table.substring((has(self.sink.mysql) ? 42 : 41)).matches('^[a-z0-9_]{0,12}_[0-9a-f]{8}_'))) || (self.delivery.deadLetter.table != self.sink.inbox.table && (self.delivery.deadLetter.table == self.sink.inbox.table + '_dead_letters' || (size(self.sink.inbox.table) > (has(self.sink.mysql) ? 51 : 50) && self.delivery.deadLetter.table.matches('^' + self.sink.inbox.table.substring(0, (has(self.sink.mysql) ? 42 : 41)) + '_[0-9a-f]{8}_dead_letters$'))))",message="the dead-letter table must not be the inbox table, nor an <inbox>_* name other than its default <inbox>_dead_letters: the operator reserves them for the inbox's own tables and partitions",fieldPath=".delivery.deadLetter.table"
// +kubebuilder:validation:XValidation:rule="!has(self.sink.postgres) || !has(self.delivery) || !has(self.delivery.deadLetter) || size(self.delivery.deadLetter.table) <= 63",message="table must be at most 63 characters on PostgreSQL",fieldPath=".delivery.deadLetter.table"
// +kubebuilder:validation:XValidation:rule="!has(self.emit) || !has(self.sink.effect.http)",message="emit is not supported with the http effect: the call runs outside the claim transaction",fieldPath=".emit"
type IdempotentConsumerSpec struct {
	// suspend scales the runtime consumer to zero replicas. Pruning goes on.
	// +optional
	Suspend bool `json:"suspend,omitempty"`

	// source is the broker to consume from. Exactly one block is set.
	// +required
	Source SourceSpec `json:"source"`

	// message says where each message's dedup id and, optionally, its entity
	// key and sequence are found.
	// +required
	Message MessageSpec `json:"message"`

	// sink is the database (PostgreSQL, or MySQL/MariaDB) holding the inbox
	// and the effect.
	// +required
	Sink SinkSpec `json:"sink"`

	// delivery tunes batching, retries and dead-lettering.
	// +kubebuilder:default={}
	// +optional
	Delivery DeliverySpec `json:"delivery,omitempty"`

	// retention decides how long processed message ids are kept.
	// +kubebuilder:default={}
	// +optional
	Retention RetentionSpec `json:"retention,omitempty"`

	// emit, when set, publishes an event per new message through a
	// transactional outbox (the event commits with the claim and the effect).
	// +optional
	Emit *EmitSpec `json:"emit,omitempty"`

	// runtime configures the consumer Deployment.
	// +kubebuilder:default={}
	// +optional
	Runtime RuntimeSpec `json:"runtime,omitempty"`
}

// SecretKeyRef selects one key of a Secret in the resource's namespace.
type SecretKeyRef struct {
	// name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// key within the Secret's data.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Key string `json:"key"`
}

// TLSSpec configures TLS towards a broker. All material comes from Secrets.
type TLSSpec struct {
	// caSecretRef holds the PEM CA bundle that signs the broker's certificate.
	// +optional
	CASecretRef *SecretKeyRef `json:"caSecretRef,omitempty"`
	// certSecretRef holds the PEM client certificate for mutual TLS.
	// +optional
	CertSecretRef *SecretKeyRef `json:"certSecretRef,omitempty"`
	// keySecretRef holds the PEM client key for mutual TLS.
	// +optional
	KeySecretRef *SecretKeyRef `json:"keySecretRef,omitempty"`
	// insecureSkipVerify disables server certificate verification. Test use only.
	// +optional
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
}

// Duration is a Go duration string such as "30s", "1h30m" or "168h".
// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
// +kubebuilder:validation:MaxLength=32
type Duration string

// SQLIdentifier is a table, column, schema or database name: lower case
// letters, digits and underscores, starting with a letter or underscore, at
// most 64 characters on MySQL/MariaDB and 63 on PostgreSQL (rules on the
// sink say which; the pattern admits the longer). It is quoted in every
// statement regardless.
// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_]{0,63}$`
// +kubebuilder:validation:MaxLength=64
type SQLIdentifier string

// ValueExpression selects a value from a message: a JSON path into the payload
// ("$.order.id"), or one of "@messageId", "@publishedAt", "@payload" (the
// whole payload as jsonb) and "@header:<Name>".
// +kubebuilder:validation:Pattern=`^(\$(\.[^.]+)*|@messageId|@publishedAt|@payload|@header:.+)$`
// +kubebuilder:validation:MaxLength=256
type ValueExpression string

// JSONPath is a dotted path into a JSON payload, such as "$.eventId".
// +kubebuilder:validation:Pattern=`^\$(\.[^.]+)+$`
// +kubebuilder:validation:MaxLength=256
type JSONPath string

// RuntimeSpec configures the consumer Deployment.
// +kubebuilder:validation:XValidation:rule="!has(self.autoscaling) || !has(self.replicas) || self.replicas == 1",message="replicas and autoscaling exclude each other: with autoscaling, KEDA sets the replicas between autoscaling.minReplicas and autoscaling.maxReplicas; leave replicas unset",fieldPath=".replicas"
type RuntimeSpec struct {
	// image of the runtime. Defaults to the operator's own runtime image.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`
	// replicas of the consumer. Concurrent replicas are safe: the inbox's
	// primary key settles races on one id.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// resources of the runtime container. A cpu, memory or ephemeral-storage
	// request may not exceed its limit (the pods would be refused). A cpu or
	// memory request that is not given (nor a limit, which Kubernetes would
	// copy into the request) defaults to 100m cpu and 128Mi memory.
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !has(self.limits) || !('cpu' in self.requests) || !('cpu' in self.limits) || !isQuantity(string(self.requests['cpu'])) || !isQuantity(string(self.limits['cpu'])) || quantity(string(self.requests['cpu'])).compareTo(quantity(string(self.limits['cpu']))) <= 0",message="the cpu request must not exceed the cpu limit",fieldPath=".requests['cpu']"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !has(self.limits) || !('memory' in self.requests) || !('memory' in self.limits) || !isQuantity(string(self.requests['memory'])) || !isQuantity(string(self.limits['memory'])) || quantity(string(self.requests['memory'])).compareTo(quantity(string(self.limits['memory']))) <= 0",message="the memory request must not exceed the memory limit",fieldPath=".requests['memory']"
	// +kubebuilder:validation:XValidation:rule="!has(self.requests) || !has(self.limits) || !('ephemeral-storage' in self.requests) || !('ephemeral-storage' in self.limits) || !isQuantity(string(self.requests['ephemeral-storage'])) || !isQuantity(string(self.limits['ephemeral-storage'])) || quantity(string(self.requests['ephemeral-storage'])).compareTo(quantity(string(self.limits['ephemeral-storage']))) <= 0",message="the ephemeral-storage request must not exceed the ephemeral-storage limit",fieldPath=".requests['ephemeral-storage']"
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// serviceAccountName the pods run as, a DNS-1123 subdomain. Its token is
	// not mounted.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
	// podAnnotations are added to the consumer pods, at most 128. Keys are
	// qualified names ([prefix/]name, the prefix a DNS-1123 subdomain), as
	// for any annotation.
	// +kubebuilder:validation:MaxProperties=128
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('(?i)^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$') && k.indexOf('/') <= 253)",message="pod annotation keys must be qualified names: an optional DNS-1123 subdomain prefix of at most 253 characters and '/', then a name of at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
	// +optional
	PodAnnotations map[string]string `json:"podAnnotations,omitempty"`
	// nodeSelector of the consumer, prune and redrive pods: the labels a
	// node must carry (e.g. to run next to the sink database). Keys are
	// label keys ([prefix/]name, the prefix a DNS-1123 subdomain of at most
	// 253 characters, the name at most 63 alphanumerics, '-', '_' or '.',
	// starting and ending alphanumeric), values label values (empty, or at
	// most 63 such characters), as Kubernetes requires of a pod.
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && k.indexOf('/') <= 253)",message="nodeSelector keys must be label keys: an optional DNS-1123 subdomain prefix of at most 253 characters and '/', then a name of at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric"
	// +optional
	NodeSelector map[string]LabelValue `json:"nodeSelector,omitempty"`
	// affinity of the consumer, prune and redrive pods: node affinity, pod
	// affinity and anti-affinity (e.g. consumers away from each other), as
	// in a pod, validated as Kubernetes validates a pod's.
	// +optional
	Affinity *Affinity `json:"affinity,omitempty"`
	// tolerations of the consumer, prune and redrive pods, as in a pod,
	// validated as Kubernetes validates a pod's.
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	// +optional
	Tolerations []Toleration `json:"tolerations,omitempty"`
	// topologySpreadConstraints of the consumer, prune and redrive pods;
	// their labelSelector usually selects the consumer pods
	// (app.kubernetes.io/instance: <name>, app.kubernetes.io/component:
	// consumer).
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(c, c.maxSkew >= 1)",message="maxSkew must be at least 1"
	// +kubebuilder:validation:XValidation:rule="self.all(c, c.whenUnsatisfiable in ['DoNotSchedule', 'ScheduleAnyway'])",message="whenUnsatisfiable must be DoNotSchedule or ScheduleAnyway"
	// +listType=atomic
	// +optional
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`
	// priorityClassName of the consumer, prune and redrive pods, a DNS-1123
	// subdomain.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// autoscaling scales the consumer on the broker's backlog with KEDA
	// (between minReplicas and maxReplicas) instead of a fixed replicas
	// count: replicas must then be left at its default (1).
	// +optional
	Autoscaling *AutoscalingSpec `json:"autoscaling,omitempty"`
}

// +kubebuilder:object:root=true

// IdempotentConsumerList is a list of IdempotentConsumers.
type IdempotentConsumerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IdempotentConsumer `json:"items"`
}
