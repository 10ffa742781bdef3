package specs

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

func TestRuntimeResourcesDefaultOnlyWhatIsNotGiven(t *testing.T) {
	q := resource.MustParse
	tests := []struct {
		name string
		in   corev1.ResourceRequirements
		want corev1.ResourceList // requests
	}{
		{"nothing given", corev1.ResourceRequirements{}, corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceMemory: q("128Mi"), corev1.ResourceEphemeralStorage: q("128Mi")}},
		{"a cpu request keeps its value", corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: q("2")}},
			corev1.ResourceList{corev1.ResourceCPU: q("2"), corev1.ResourceMemory: q("128Mi"), corev1.ResourceEphemeralStorage: q("128Mi")}},
		// Kubernetes copies a limit into a missing request; a default
		// above the limit would make the pod invalid.
		{"a memory limit alone sets no memory request", corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: q("64Mi")}},
			corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceEphemeralStorage: q("128Mi")}},
		{"other resources are kept", corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceEphemeralStorage: q("1Gi")}},
			corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceMemory: q("128Mi"), corev1.ResourceEphemeralStorage: q("1Gi")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.in.DeepCopy()
			got := RuntimeResources(tc.in)
			if len(got.Requests) != len(tc.want) {
				t.Fatalf("requests %v, want %v", got.Requests, tc.want)
			}
			for name, w := range tc.want {
				if g := got.Requests[name]; g.Cmp(w) != 0 {
					t.Errorf("request %s = %s, want %s", name, g.String(), w.String())
				}
			}
			if len(tc.in.Requests) != len(before.Requests) {
				t.Error("the spec's own resources were modified")
			}
		})
	}
}

// The API's placement types are core/v1's in JSON: every field of a fully
// populated placement reaches the pod spec as if the same JSON had been
// read into core/v1's types, and no core/v1 field is missing from ours
// (one added upstream would otherwise be pruned at admission).
func TestPlacementIsCoreV1InJSON(t *testing.T) {
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"a"}}}}
	term := messagingv1alpha1.PodAffinityTerm{LabelSelector: selector, Namespaces: []string{"ns"}, TopologyKey: "zone",
		NamespaceSelector: selector, MatchLabelKeys: []string{"k"}, MismatchLabelKeys: []string{"m"}}
	nodeTerm := messagingv1alpha1.NodeSelectorTerm{
		MatchExpressions: []messagingv1alpha1.NodeSelectorRequirement{{Key: "cores", Operator: corev1.NodeSelectorOpGt, Values: []string{"3"}}},
		MatchFields:      []messagingv1alpha1.NodeFieldSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}},
	}
	pods := &messagingv1alpha1.PodAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution:  []messagingv1alpha1.PodAffinityTerm{term},
		PreferredDuringSchedulingIgnoredDuringExecution: []messagingv1alpha1.WeightedPodAffinityTerm{{Weight: 7, PodAffinityTerm: term}},
	}
	a := &messagingv1alpha1.Affinity{
		NodeAffinity: &messagingv1alpha1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution:  &messagingv1alpha1.NodeSelector{NodeSelectorTerms: []messagingv1alpha1.NodeSelectorTerm{nodeTerm}},
			PreferredDuringSchedulingIgnoredDuringExecution: []messagingv1alpha1.PreferredSchedulingTerm{{Weight: 3, Preference: nodeTerm}},
		},
		PodAffinity: pods, PodAntiAffinity: pods,
	}
	tolerations := []messagingv1alpha1.Toleration{{Key: "k", Operator: corev1.TolerationOpEqual, Value: "v", Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(int64(5))}}
	viaJSON := func(in, out any) {
		t.Helper()
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatal(err)
		}
	}
	var wantAffinity corev1.Affinity
	viaJSON(a, &wantAffinity)
	if got := CoreAffinity(a); !equality.Semantic.DeepEqual(got, &wantAffinity) {
		t.Errorf("coreAffinity = %+v, want %+v", got, &wantAffinity)
	}
	var wantTolerations []corev1.Toleration
	viaJSON(tolerations, &wantTolerations)
	if got := CoreTolerations(tolerations); !equality.Semantic.DeepEqual(got, wantTolerations) {
		t.Errorf("coreTolerations = %+v, want %+v", got, wantTolerations)
	}
	if got := CoreNodeSelector(map[string]messagingv1alpha1.LabelValue{"zone": "a"}); !equality.Semantic.DeepEqual(got, map[string]string{"zone": "a"}) {
		t.Errorf("coreNodeSelector = %v", got)
	}
	if CoreAffinity(nil) != nil || CoreTolerations(nil) != nil || CoreNodeSelector(nil) != nil {
		t.Error("an absent placement renders as something")
	}

	for _, pair := range [][2]reflect.Type{
		{reflect.TypeFor[messagingv1alpha1.Affinity](), reflect.TypeFor[corev1.Affinity]()},
		{reflect.TypeFor[messagingv1alpha1.PodAffinity](), reflect.TypeFor[corev1.PodAntiAffinity]()},
		{reflect.TypeFor[messagingv1alpha1.NodeFieldSelectorRequirement](), reflect.TypeFor[corev1.NodeSelectorRequirement]()},
		{reflect.TypeFor[messagingv1alpha1.Toleration](), reflect.TypeFor[corev1.Toleration]()},
	} {
		if missing := missingJSONFields(pair[0], pair[1], pair[1].Name()); len(missing) > 0 {
			t.Errorf("%s lacks core/v1 fields %v", pair[0].Name(), missing)
		}
	}
}

// missingJSONFields lists the JSON fields of core (recursively, through
// structs, pointers and slices of the same name) that ours lacks.
func missingJSONFields(ours, core reflect.Type, path string) []string {
	deref := func(t reflect.Type) reflect.Type {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		return t
	}
	ours, core = deref(ours), deref(core)
	if core.Kind() != reflect.Struct || core.PkgPath() != reflect.TypeFor[corev1.Affinity]().PkgPath() {
		return nil
	}
	byName := map[string]reflect.Type{}
	for f := range ours.Fields() {
		byName[strings.Split(f.Tag.Get("json"), ",")[0]] = f.Type
	}
	var missing []string
	for f := range core.Fields() {
		name := strings.Split(f.Tag.Get("json"), ",")[0]
		t, ok := byName[name]
		if !ok {
			missing = append(missing, path+"."+name)
			continue
		}
		missing = append(missing, missingJSONFields(t, f.Type, path+"."+name)...)
	}
	return missing
}
