package controllers

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// The API server refuses at admission, naming the field, every placement
// Kubernetes would refuse on the rendered Deployment: nodeSelector keys and
// values that are not labels, toleration operators and effects outside
// Kubernetes' enums (and its other toleration rules), node affinity
// operators that do not exist (and values an operator does not take),
// weights outside 1-100, a pod affinity term without a topology key. The
// valid variants Kubernetes takes (empty operator and effect, Exists with
// no key, Gt with one value) are accepted. Each is a dry run: the manager
// never sees them.
var _ = Describe("placement admission", func() {
	dryRun := func(mutate func(*messagingv1alpha1.RuntimeSpec)) error {
		idc := newConsumer("place-"+randomSuffix(), "PLACE", "place-db")
		mutate(&idc.Spec.Runtime)
		return k8sClient.Create(ctx, idc, client.DryRunAll)
	}
	required := func(reqs ...messagingv1alpha1.NodeSelectorRequirement) *messagingv1alpha1.Affinity {
		return &messagingv1alpha1.Affinity{NodeAffinity: &messagingv1alpha1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &messagingv1alpha1.NodeSelector{
				NodeSelectorTerms: []messagingv1alpha1.NodeSelectorTerm{{MatchExpressions: reqs}},
			}}}
	}
	preferred := func(weight int32, reqs ...messagingv1alpha1.NodeSelectorRequirement) *messagingv1alpha1.Affinity {
		return &messagingv1alpha1.Affinity{NodeAffinity: &messagingv1alpha1.NodeAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []messagingv1alpha1.PreferredSchedulingTerm{{
				Weight: weight, Preference: messagingv1alpha1.NodeSelectorTerm{MatchExpressions: reqs},
			}}}}
	}
	req := func(key string, op corev1.NodeSelectorOperator, values ...string) messagingv1alpha1.NodeSelectorRequirement {
		return messagingv1alpha1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
	}
	tol := func(t messagingv1alpha1.Toleration) []messagingv1alpha1.Toleration {
		return []messagingv1alpha1.Toleration{t}
	}
	const (
		nodeAffinityTerm = "spec.runtime.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]"
		preferredTerm    = "spec.runtime.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
	)

	DescribeTable("refuses an invalid placement, naming the field",
		func(mutate func(*messagingv1alpha1.RuntimeSpec), field, want string) {
			err := dryRun(mutate)
			Expect(err).To(HaveOccurred(), "the API server accepted an invalid %s", field)
			Expect(err.Error()).To(ContainSubstring(field))
			Expect(err.Error()).To(ContainSubstring(want))
		},
		// nodeSelector: keys and values are labels.
		Entry("a nodeSelector key with a space", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.NodeSelector = map[string]messagingv1alpha1.LabelValue{"disk type": "ssd"}
		}, "spec.runtime.nodeSelector", "nodeSelector keys must be label keys"),
		Entry("a nodeSelector key with an upper-case prefix", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.NodeSelector = map[string]messagingv1alpha1.LabelValue{"Example.COM/zone": "a"}
		}, "spec.runtime.nodeSelector", "nodeSelector keys must be label keys"),
		Entry("a nodeSelector key whose name passes 63 characters", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.NodeSelector = map[string]messagingv1alpha1.LabelValue{"example.com/" + strings.Repeat("k", 64): "a"}
		}, "spec.runtime.nodeSelector", "nodeSelector keys must be label keys"),
		Entry("a nodeSelector value with a slash", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.NodeSelector = map[string]messagingv1alpha1.LabelValue{"zone": "eu/west"}
		}, "spec.runtime.nodeSelector.zone", "should match"),
		Entry("a nodeSelector value of 64 characters", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.NodeSelector = map[string]messagingv1alpha1.LabelValue{"zone": messagingv1alpha1.LabelValue(strings.Repeat("a", 64))}
		}, "spec.runtime.nodeSelector.zone", "may not be more than 63"),
		Entry("a nodeSelector value ending in '-'", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.NodeSelector = map[string]messagingv1alpha1.LabelValue{"zone": "a-"}
		}, "spec.runtime.nodeSelector.zone", "should match"),

		// tolerations: Kubernetes' enums and rules.
		Entry("a toleration operator outside Exists|Equal", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Tolerations = tol(messagingv1alpha1.Toleration{Key: "dedicated", Operator: "In", Value: "x"})
		}, "spec.runtime.tolerations[0].operator", `Unsupported value: "In"`),
		Entry("a toleration operator in the wrong case", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Tolerations = tol(messagingv1alpha1.Toleration{Key: "dedicated", Operator: "exists"})
		}, "spec.runtime.tolerations[0].operator", `Unsupported value: "exists"`),
		Entry("a toleration effect outside NoSchedule|PreferNoSchedule|NoExecute", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Tolerations = tol(messagingv1alpha1.Toleration{Key: "dedicated", Operator: corev1.TolerationOpExists, Effect: "NoScheduleNoAdmit"})
		}, "spec.runtime.tolerations[0].effect", `Unsupported value: "NoScheduleNoAdmit"`),
		Entry("a toleration key that is not a label key", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Tolerations = tol(messagingv1alpha1.Toleration{Key: "dedicated!", Operator: corev1.TolerationOpExists})
		}, "spec.runtime.tolerations[0].key", "should match"),
		Entry("a toleration value that is not a label value", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Tolerations = tol(messagingv1alpha1.Toleration{Key: "dedicated", Value: "a b"})
		}, "spec.runtime.tolerations[0].value", "should match"),
		Entry("a toleration without a key and operator Equal", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Tolerations = tol(messagingv1alpha1.Toleration{Operator: corev1.TolerationOpEqual, Value: "x"})
		}, "spec.runtime.tolerations[0].operator", "operator must be Exists when key is empty"),
		Entry("tolerationSeconds without effect NoExecute", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Tolerations = tol(messagingv1alpha1.Toleration{Key: "dedicated", Operator: corev1.TolerationOpExists,
				Effect: corev1.TaintEffectNoSchedule, TolerationSeconds: ptr.To(int64(60))})
		}, "spec.runtime.tolerations[0].effect", "effect must be NoExecute when tolerationSeconds is set"),

		// affinity: node selector requirements.
		Entry("a node affinity operator that does not exist", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = required(req("kubernetes.io/arch", "Includes", "amd64"))
		}, nodeAffinityTerm+".operator", `Unsupported value: "Includes"`),
		Entry("a preferred node affinity operator that does not exist", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = preferred(10, req("disk", "Equals", "ssd"))
		}, preferredTerm+".preference.matchExpressions[0].operator", `Unsupported value: "Equals"`),
		Entry("a node affinity key that is not a label key", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = required(req("kubernetes.io/", corev1.NodeSelectorOpExists))
		}, nodeAffinityTerm+".key", "should match"),
		Entry("In without values", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = required(req("kubernetes.io/arch", corev1.NodeSelectorOpIn))
		}, nodeAffinityTerm+".values", "values must be given when operator is In or NotIn"),
		Entry("Exists with values", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = required(req("disk", corev1.NodeSelectorOpExists, "ssd"))
		}, nodeAffinityTerm+".values", "values must be empty when operator is Exists or DoesNotExist"),
		Entry("Gt with two values", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = required(req("example.com/cores", corev1.NodeSelectorOpGt, "3", "4"))
		}, nodeAffinityTerm+".values", "exactly one value must be given when operator is Gt or Lt"),
		Entry("a node affinity value that is not a label value", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = required(req("zone", corev1.NodeSelectorOpIn, "eu west"))
		}, nodeAffinityTerm+".values[0]", "should match"),
		Entry("a node selector with no terms", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = &messagingv1alpha1.Affinity{NodeAffinity: &messagingv1alpha1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &messagingv1alpha1.NodeSelector{NodeSelectorTerms: []messagingv1alpha1.NodeSelectorTerm{}}}}
		}, "spec.runtime.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", "should have at least 1 items"),
		Entry("a node field other than metadata.name", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = &messagingv1alpha1.Affinity{NodeAffinity: &messagingv1alpha1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &messagingv1alpha1.NodeSelector{NodeSelectorTerms: []messagingv1alpha1.NodeSelectorTerm{{
					MatchFields: []messagingv1alpha1.NodeFieldSelectorRequirement{{Key: "spec.unschedulable", Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}}}}}}}}
		}, "spec.runtime.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].key", `Unsupported value: "spec.unschedulable"`),
		Entry("a preferred term of weight 0", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = preferred(0, req("disk", corev1.NodeSelectorOpExists))
		}, preferredTerm+".weight", "should be greater than or equal to 1"),

		// affinity: pod (anti-)affinity terms.
		Entry("a pod anti-affinity term without a topology key", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = &messagingv1alpha1.Affinity{PodAntiAffinity: &messagingv1alpha1.PodAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: []messagingv1alpha1.PodAffinityTerm{{
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}}}}}
		}, "spec.runtime.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey", "should be at least 1 chars long"),
		Entry("a pod affinity weight of 101", func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.Affinity = &messagingv1alpha1.Affinity{PodAffinity: &messagingv1alpha1.PodAffinity{
				PreferredDuringSchedulingIgnoredDuringExecution: []messagingv1alpha1.WeightedPodAffinityTerm{{Weight: 101,
					PodAffinityTerm: messagingv1alpha1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname"}}}}}
		}, "spec.runtime.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight", "should be less than or equal to 100"),
	)

	It("accepts what Kubernetes accepts: empty operator and effect, Exists without a key, Gt with one value, empty label values", func() {
		Expect(dryRun(func(rt *messagingv1alpha1.RuntimeSpec) {
			rt.NodeSelector = map[string]messagingv1alpha1.LabelValue{"topology.kubernetes.io/zone": "eu-west-1a", "example.com/Node_Pool.v2": "", "kubernetes.io/os": "linux"}
			rt.Tolerations = []messagingv1alpha1.Toleration{
				{Key: "dedicated", Value: "consumers"},
				{Operator: corev1.TolerationOpExists},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(int64(300))},
				{Key: "spot", Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectPreferNoSchedule},
			}
			rt.Affinity = required(
				req("kubernetes.io/arch", corev1.NodeSelectorOpNotIn, "s390x"),
				req("example.com/cores", corev1.NodeSelectorOpLt, "65"),
				req("example.com/gpu", corev1.NodeSelectorOpDoesNotExist),
			)
			rt.Affinity.PodAffinity = &messagingv1alpha1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []messagingv1alpha1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}, TopologyKey: "topology.kubernetes.io/zone",
				Namespaces: []string{"databases"}, MatchLabelKeys: []string{"pod-template-hash"},
			}}}
		})).To(Succeed())
	})
})
