package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The placement of the runtime's pods (spec.runtime.affinity, tolerations)
// in the JSON shape of Kubernetes' own core/v1 types, so a manifest written
// for a pod works here unchanged, but with Kubernetes' pod validation
// declared in the schema: the API server refuses at admission, naming the
// field, what it would refuse on the rendered Deployment (a label key or
// value that is not one, an operator or effect outside the enums, values
// an operator does not take, a weight outside 1-100). The lists are
// bounded (core/v1's are not), which the CEL rules' cost needs; the bounds
// are far above any real placement. Node affinity values are held to
// label values in preferred terms too (Kubernetes allows any there, but no
// node label can equal one that is not a label value). What CEL does not
// mirror (a key in both matchLabelKeys and labelSelector, label selectors'
// own rules) the API server still refuses on the Deployment, and the
// resource stalls with InvalidSpec naming the field.

// LabelValue is a label value: empty, or at most 63 alphanumerics, '-',
// '_' or '.', starting and ending alphanumeric.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:Pattern=`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`
type LabelValue string

// Affinity is core/v1 Affinity: node affinity, pod affinity and pod
// anti-affinity.
type Affinity struct {
	// nodeAffinity: the nodes the pods may (required) or should (preferred)
	// run on, by node label.
	// +optional
	NodeAffinity *NodeAffinity `json:"nodeAffinity,omitempty"`
	// podAffinity: co-locate the pods with other pods.
	// +optional
	PodAffinity *PodAffinity `json:"podAffinity,omitempty"`
	// podAntiAffinity: keep the pods away from other pods (e.g. each other).
	// +optional
	PodAntiAffinity *PodAffinity `json:"podAntiAffinity,omitempty"`
}

// NodeAffinity is core/v1 NodeAffinity.
type NodeAffinity struct {
	// +optional
	RequiredDuringSchedulingIgnoredDuringExecution *NodeSelector `json:"requiredDuringSchedulingIgnoredDuringExecution,omitempty"`
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	PreferredDuringSchedulingIgnoredDuringExecution []PreferredSchedulingTerm `json:"preferredDuringSchedulingIgnoredDuringExecution,omitempty"`
}

// NodeSelector is core/v1 NodeSelector: the terms are ORed.
type NodeSelector struct {
	// nodeSelectorTerms: at least one.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +required
	NodeSelectorTerms []NodeSelectorTerm `json:"nodeSelectorTerms"`
}

// NodeSelectorTerm is core/v1 NodeSelectorTerm: the requirements are ANDed.
type NodeSelectorTerm struct {
	// matchExpressions on node labels.
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	MatchExpressions []NodeSelectorRequirement `json:"matchExpressions,omitempty"`
	// matchFields on node fields (metadata.name only).
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	MatchFields []NodeFieldSelectorRequirement `json:"matchFields,omitempty"`
}

// NodeSelectorRequirement is core/v1 NodeSelectorRequirement on a node label.
// +kubebuilder:validation:XValidation:rule="!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",message="values must be given when operator is In or NotIn",fieldPath=".values"
// +kubebuilder:validation:XValidation:rule="!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",message="values must be empty when operator is Exists or DoesNotExist",fieldPath=".values"
// +kubebuilder:validation:XValidation:rule="!(self.operator in ['Gt', 'Lt']) || (has(self.values) && size(self.values) == 1)",message="exactly one value must be given when operator is Gt or Lt",fieldPath=".values"
type NodeSelectorRequirement struct {
	// key is a label key: an optional DNS-1123 subdomain prefix and '/',
	// then a name of at most 63 alphanumerics, '-', '_' or '.', starting and
	// ending alphanumeric.
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`
	// +required
	Key string `json:"key"`
	// operator is one of In, NotIn, Exists, DoesNotExist, Gt, Lt.
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist;Gt;Lt
	// +required
	Operator corev1.NodeSelectorOperator `json:"operator"`
	// values: label values (at most 63 alphanumerics, '-', '_' or '.',
	// starting and ending alphanumeric); one or more for In and NotIn, none
	// for Exists and DoesNotExist, exactly one (an integer) for Gt and Lt.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`
	// +listType=atomic
	// +optional
	Values []string `json:"values,omitempty"`
}

// NodeFieldSelectorRequirement is a core/v1 NodeSelectorRequirement on a
// node field: metadata.name In or NotIn one node name.
type NodeFieldSelectorRequirement struct {
	// key: metadata.name, the one node field Kubernetes selects on.
	// +kubebuilder:validation:Enum=metadata.name
	// +required
	Key string `json:"key"`
	// operator: In or NotIn.
	// +kubebuilder:validation:Enum=In;NotIn
	// +required
	Operator corev1.NodeSelectorOperator `json:"operator"`
	// values: exactly one node name (a DNS-1123 subdomain).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +listType=atomic
	// +required
	Values []string `json:"values"`
}

// PreferredSchedulingTerm is core/v1 PreferredSchedulingTerm.
type PreferredSchedulingTerm struct {
	// weight, 1-100.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +required
	Weight int32 `json:"weight"`
	// +required
	Preference NodeSelectorTerm `json:"preference"`
}

// PodAffinity is core/v1 PodAffinity (and PodAntiAffinity: the same shape).
type PodAffinity struct {
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	RequiredDuringSchedulingIgnoredDuringExecution []PodAffinityTerm `json:"requiredDuringSchedulingIgnoredDuringExecution,omitempty"`
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +optional
	PreferredDuringSchedulingIgnoredDuringExecution []WeightedPodAffinityTerm `json:"preferredDuringSchedulingIgnoredDuringExecution,omitempty"`
}

// WeightedPodAffinityTerm is core/v1 WeightedPodAffinityTerm.
type WeightedPodAffinityTerm struct {
	// weight, 1-100.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +required
	Weight int32 `json:"weight"`
	// +required
	PodAffinityTerm PodAffinityTerm `json:"podAffinityTerm"`
}

// PodAffinityTerm is core/v1 PodAffinityTerm.
type PodAffinityTerm struct {
	// labelSelector of the pods to be near (or away from).
	// +optional
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`
	// namespaces (DNS-1123 labels) the labelSelector applies to; none: the
	// resource's own.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +listType=atomic
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
	// topologyKey is the node label key whose value defines "near"
	// (e.g. kubernetes.io/hostname); required.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`
	// +required
	TopologyKey string `json:"topologyKey"`
	// namespaceSelector of the namespaces the labelSelector applies to.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// matchLabelKeys: label keys whose values, read from the incoming pod,
	// are ANDed into the labelSelector.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=317
	// +kubebuilder:validation:items:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`
	// +listType=atomic
	// +optional
	MatchLabelKeys []string `json:"matchLabelKeys,omitempty"`
	// mismatchLabelKeys: as matchLabelKeys, with NotIn.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=317
	// +kubebuilder:validation:items:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`
	// +listType=atomic
	// +optional
	MismatchLabelKeys []string `json:"mismatchLabelKeys,omitempty"`
}

// Toleration is core/v1 Toleration.
// +kubebuilder:validation:XValidation:rule="(has(self.key) && size(self.key) > 0) || (has(self.operator) && self.operator == 'Exists')",message="operator must be Exists when key is empty (which tolerates every taint)",fieldPath=".operator"
// +kubebuilder:validation:XValidation:rule="!has(self.operator) || self.operator != 'Exists' || !has(self.value) || size(self.value) == 0",message="a toleration with operator Exists takes no value",fieldPath=".value"
// +kubebuilder:validation:XValidation:rule="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",message="effect must be NoExecute when tolerationSeconds is set",fieldPath=".effect"
type Toleration struct {
	// key of the taint, a label key; empty (with operator Exists) tolerates
	// every taint.
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^(([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`
	// +optional
	Key string `json:"key,omitempty"`
	// operator: Equal (the default, also when empty) or Exists.
	// +kubebuilder:validation:Enum=Equal;Exists;""
	// +optional
	Operator corev1.TolerationOperator `json:"operator,omitempty"`
	// value of the taint, a label value; empty with operator Exists.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$`
	// +optional
	Value string `json:"value,omitempty"`
	// effect: NoSchedule, PreferNoSchedule, NoExecute, or empty for all.
	// +kubebuilder:validation:Enum=NoSchedule;PreferNoSchedule;NoExecute;""
	// +optional
	Effect corev1.TaintEffect `json:"effect,omitempty"`
	// tolerationSeconds a NoExecute taint is tolerated for before eviction.
	// +optional
	TolerationSeconds *int64 `json:"tolerationSeconds,omitempty"`
}
