package specs

import (
	corev1 "k8s.io/api/core/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// The placement types of the API are core/v1's in JSON, with Kubernetes'
// validation in the schema; these copy them into a pod spec.

// CoreNodeSelector is spec.runtime.nodeSelector as core/v1's.
func CoreNodeSelector(m map[string]messagingv1alpha1.LabelValue) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = string(v)
	}
	return out
}

// CoreAffinity is spec.runtime.affinity as core/v1's.
func CoreAffinity(a *messagingv1alpha1.Affinity) *corev1.Affinity {
	if a == nil {
		return nil
	}
	out := &corev1.Affinity{PodAffinity: corePodAffinity(a.PodAffinity)}
	if anti := corePodAffinity(a.PodAntiAffinity); anti != nil {
		out.PodAntiAffinity = &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution:  anti.RequiredDuringSchedulingIgnoredDuringExecution,
			PreferredDuringSchedulingIgnoredDuringExecution: anti.PreferredDuringSchedulingIgnoredDuringExecution,
		}
	}
	if na := a.NodeAffinity; na != nil {
		out.NodeAffinity = &corev1.NodeAffinity{}
		if req := na.RequiredDuringSchedulingIgnoredDuringExecution; req != nil {
			sel := &corev1.NodeSelector{}
			for _, t := range req.NodeSelectorTerms {
				sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, coreNodeSelectorTerm(t))
			}
			out.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = sel
		}
		for _, p := range na.PreferredDuringSchedulingIgnoredDuringExecution {
			out.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(out.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution,
				corev1.PreferredSchedulingTerm{Weight: p.Weight, Preference: coreNodeSelectorTerm(p.Preference)})
		}
	}
	return out
}

func coreNodeSelectorTerm(t messagingv1alpha1.NodeSelectorTerm) corev1.NodeSelectorTerm {
	var out corev1.NodeSelectorTerm
	for _, r := range t.MatchExpressions {
		out.MatchExpressions = append(out.MatchExpressions, corev1.NodeSelectorRequirement{Key: r.Key, Operator: r.Operator, Values: append([]string(nil), r.Values...)})
	}
	for _, r := range t.MatchFields {
		out.MatchFields = append(out.MatchFields, corev1.NodeSelectorRequirement{Key: r.Key, Operator: r.Operator, Values: append([]string(nil), r.Values...)})
	}
	return out
}

// corePodAffinity serves podAffinity and podAntiAffinity (one shape).
func corePodAffinity(a *messagingv1alpha1.PodAffinity) *corev1.PodAffinity {
	if a == nil {
		return nil
	}
	out := &corev1.PodAffinity{}
	for _, t := range a.RequiredDuringSchedulingIgnoredDuringExecution {
		out.RequiredDuringSchedulingIgnoredDuringExecution = append(out.RequiredDuringSchedulingIgnoredDuringExecution, corePodAffinityTerm(t))
	}
	for _, w := range a.PreferredDuringSchedulingIgnoredDuringExecution {
		out.PreferredDuringSchedulingIgnoredDuringExecution = append(out.PreferredDuringSchedulingIgnoredDuringExecution,
			corev1.WeightedPodAffinityTerm{Weight: w.Weight, PodAffinityTerm: corePodAffinityTerm(w.PodAffinityTerm)})
	}
	return out
}

func corePodAffinityTerm(t messagingv1alpha1.PodAffinityTerm) corev1.PodAffinityTerm {
	return corev1.PodAffinityTerm{
		LabelSelector:     t.LabelSelector.DeepCopy(),
		Namespaces:        append([]string(nil), t.Namespaces...),
		TopologyKey:       t.TopologyKey,
		NamespaceSelector: t.NamespaceSelector.DeepCopy(),
		MatchLabelKeys:    append([]string(nil), t.MatchLabelKeys...),
		MismatchLabelKeys: append([]string(nil), t.MismatchLabelKeys...),
	}
}

// CoreTolerations is spec.runtime.tolerations as core/v1's.
func CoreTolerations(ts []messagingv1alpha1.Toleration) []corev1.Toleration {
	if ts == nil {
		return nil
	}
	out := make([]corev1.Toleration, 0, len(ts))
	for _, t := range ts {
		ct := corev1.Toleration{Key: t.Key, Operator: t.Operator, Value: t.Value, Effect: t.Effect}
		if t.TolerationSeconds != nil {
			s := *t.TolerationSeconds
			ct.TolerationSeconds = &s
		}
		out = append(out, ct)
	}
	return out
}
