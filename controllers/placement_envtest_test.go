package controllers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
)

var _ = Describe("pod placement and resources", func() {
	It("passes spec.runtime's placement to the Deployment and the CronJob, with default requests and a bounded /tmp", func() {
		name := "placed-" + randomSuffix()
		newSecret(name+"-db", testDSN)
		idc := newConsumer(name, newStream(24*time.Hour), name+"-db")
		idc.Spec.Runtime.Resources = corev1.ResourceRequirements{}
		consumers := &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/instance": name, "app.kubernetes.io/component": "consumer"}}
		idc.Spec.Runtime.NodeSelector = map[string]messagingv1alpha1.LabelValue{"topology.kubernetes.io/zone": "zone-a"}
		idc.Spec.Runtime.Affinity = &messagingv1alpha1.Affinity{
			PodAntiAffinity: &messagingv1alpha1.PodAffinity{
				PreferredDuringSchedulingIgnoredDuringExecution: []messagingv1alpha1.WeightedPodAffinityTerm{{Weight: 100, PodAffinityTerm: messagingv1alpha1.PodAffinityTerm{
					LabelSelector: consumers, TopologyKey: "kubernetes.io/hostname",
				}}},
			},
			NodeAffinity: &messagingv1alpha1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &messagingv1alpha1.NodeSelector{NodeSelectorTerms: []messagingv1alpha1.NodeSelectorTerm{{
					MatchExpressions: []messagingv1alpha1.NodeSelectorRequirement{
						{Key: "kubernetes.io/arch", Operator: corev1.NodeSelectorOpIn, Values: []string{"amd64", "arm64"}},
						{Key: "example.com/cores", Operator: corev1.NodeSelectorOpGt, Values: []string{"3"}},
					},
					MatchFields: []messagingv1alpha1.NodeFieldSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"node-7"}}},
				}}},
				PreferredDuringSchedulingIgnoredDuringExecution: []messagingv1alpha1.PreferredSchedulingTerm{{Weight: 1, Preference: messagingv1alpha1.NodeSelectorTerm{
					MatchExpressions: []messagingv1alpha1.NodeSelectorRequirement{{Key: "disk", Operator: corev1.NodeSelectorOpExists}},
				}}},
			},
		}
		idc.Spec.Runtime.Tolerations = []messagingv1alpha1.Toleration{
			{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "consumers", Effect: corev1.TaintEffectNoSchedule},
			{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(int64(30))},
		}
		idc.Spec.Runtime.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: consumers,
		}}
		idc.Spec.Runtime.PriorityClassName = "consumers-high"
		create(idc)

		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-prune"}, &batchv1.CronJob{})
		}, timeout, interval).Should(Succeed())
		for kind, spec := range map[string]corev1.PodSpec{
			"Deployment": deployment(name).Spec.Template.Spec,
			"CronJob":    cronJob(name).Spec.JobTemplate.Spec.Template.Spec,
		} {
			By(kind)
			Expect(spec.NodeSelector).To(Equal(specs.CoreNodeSelector(idc.Spec.Runtime.NodeSelector)), kind)
			Expect(spec.Affinity).To(Equal(specs.CoreAffinity(idc.Spec.Runtime.Affinity)), kind)
			Expect(spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[1].Operator).To(Equal(corev1.NodeSelectorOpGt), kind)
			Expect(spec.Tolerations).To(Equal(specs.CoreTolerations(idc.Spec.Runtime.Tolerations)), kind)
			Expect(spec.Tolerations).To(HaveLen(2), kind)
			Expect(spec.TopologySpreadConstraints).To(Equal(idc.Spec.Runtime.TopologySpreadConstraints), kind)
			Expect(spec.PriorityClassName).To(Equal("consumers-high"), kind)
			requests := spec.Containers[0].Resources.Requests
			Expect(requests.Cpu().Cmp(resource.MustParse("100m"))).To(Equal(0), kind)
			Expect(requests.Memory().Cmp(resource.MustParse("128Mi"))).To(Equal(0), kind)
			var tmp *corev1.Volume
			for i := range spec.Volumes {
				if spec.Volumes[i].Name == "tmp" {
					tmp = &spec.Volumes[i]
				}
			}
			Expect(tmp).NotTo(BeNil(), kind)
			Expect(tmp.EmptyDir.SizeLimit).NotTo(BeNil(), kind)
			Expect(tmp.EmptyDir.SizeLimit.Cmp(resource.MustParse("64Mi"))).To(Equal(0), kind)
		}

		// A change of placement reaches the children.
		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) {
			idc.Spec.Runtime.NodeSelector = map[string]messagingv1alpha1.LabelValue{"topology.kubernetes.io/zone": "zone-b"}
		})
		Eventually(func() map[string]string { return deployment(name).Spec.Template.Spec.NodeSelector }, timeout, interval).
			Should(HaveKeyWithValue("topology.kubernetes.io/zone", "zone-b"))
		Eventually(func() map[string]string { return cronJob(name).Spec.JobTemplate.Spec.Template.Spec.NodeSelector }, timeout, interval).
			Should(HaveKeyWithValue("topology.kubernetes.io/zone", "zone-b"))
	})

	It("refuses a toleration with operator Exists and a value, and a maxSkew of 0", func() {
		name := "placed-bad-" + randomSuffix()
		idc := newConsumer(name, "ORDERS", name+"-db")
		idc.Spec.Runtime.Tolerations = []messagingv1alpha1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists, Value: "x"}}
		err := k8sClient.Create(ctx, idc)
		Expect(err).To(MatchError(ContainSubstring("operator Exists takes no value")))
		idc = newConsumer(name, "ORDERS", name+"-db")
		idc.Spec.Runtime.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 0, TopologyKey: "zone", WhenUnsatisfiable: corev1.DoNotSchedule}}
		Expect(k8sClient.Create(ctx, idc)).To(MatchError(ContainSubstring("maxSkew must be at least 1")))
	})
	It("stalls with InvalidSpec naming the spec field when the API server refuses the rendered Deployment, and recovers when fixed", func() {
		// A label selector's operator is one rule the schema does not
		// mirror (metav1.LabelSelector is Kubernetes' own type): the
		// resource is admitted, the Deployment is refused (422).
		name := "placed-refused-" + randomSuffix()
		newSecret(name+"-db", testDSN)
		idc := newConsumer(name, newStream(24*time.Hour), name+"-db")
		idc.Spec.Runtime.Affinity = &messagingv1alpha1.Affinity{PodAntiAffinity: &messagingv1alpha1.PodAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []messagingv1alpha1.PodAffinityTerm{{
				TopologyKey: "kubernetes.io/hostname",
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
					Key: "app", Operator: "Sometimes", Values: []string{"x"}}}},
			}},
		}}
		create(idc)
		Eventually(condition(name, messagingv1alpha1.ConditionStalled), timeout, interval).Should(Equal("True/" + messagingv1alpha1.ReasonInvalidSpec))
		stalled := meta.FindStatusCondition(get(name).Status.Conditions, messagingv1alpha1.ConditionStalled)
		Expect(stalled.Message).To(ContainSubstring("spec.runtime.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].operator"))
		Expect(stalled.Message).To(ContainSubstring(`"Sometimes"`))
		Expect(condition(name, messagingv1alpha1.ConditionReady)()).To(Equal("False/" + messagingv1alpha1.ReasonInvalidSpec))
		Expect(condition(name, messagingv1alpha1.ConditionReconciling)()).To(HavePrefix("False/"))
		Expect(get(name).Status.ObservedGeneration).To(Equal(get(name).Generation))
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &appsv1.Deployment{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a Deployment exists: %v", err)

		update(name, func(idc *messagingv1alpha1.IdempotentConsumer) {
			idc.Spec.Runtime.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].LabelSelector.MatchExpressions[0].Operator = metav1.LabelSelectorOpIn
		})
		Eventually(condition(name, messagingv1alpha1.ConditionStalled), timeout, interval).Should(Equal("False/" + messagingv1alpha1.ReasonReady))
		Expect(deployment(name).Spec.Template.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].LabelSelector.MatchExpressions[0].Operator).
			To(Equal(metav1.LabelSelectorOpIn))
	})
})
