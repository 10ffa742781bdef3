package controllers

import (
	"fmt"
	"slices"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// A partitioned resource renders one Deployment, PodDisruptionBudget and
// ScaledObject per partition, each selecting only its partition's pods and
// scaling on its own durable; unpartitioned, one of each under the
// resource's name, as before.
func TestPartitionedWorkloads(t *testing.T) {
	idc := withAutoscaling(unitConsumer(), 0, 4)
	one := specs.Workloads(idc)
	if len(one) != 1 || one[0].Name != "orders" || one[0].Partitioned() {
		t.Fatalf("unpartitioned: workloads %+v, want the one named orders", one)
	}
	if args := specs.Deployment(idc, mustRender(t, idc), "img", "h", one[0]).Spec.Template.Spec.Containers[0].Args; slices.ContainsFunc(args, func(a string) bool { return len(a) > 11 && a[:11] == "--partition" }) {
		t.Fatalf("unpartitioned pods run with %v: no --partition wanted", args)
	}

	idc.Spec.Source.NATSJetStream.Partitions = ptr.To(int32(3))
	rc := mustRender(t, idc)
	if got := rc.Config.Source.NATSJetStream.Partitions; got != 3 {
		t.Fatalf("the runtime config says partitions %d, want 3", got)
	}
	ws := specs.Workloads(idc)
	if len(ws) != 3 {
		t.Fatalf("3 partitions: %d workloads", len(ws))
	}
	selectors := map[string]bool{}
	for i, w := range ws {
		wantName, wantConsumer := fmt.Sprintf("orders-p%d", i), fmt.Sprintf("orders-p%d", i)
		if w.Name != wantName || w.Consumer != wantConsumer || w.Partition != i {
			t.Errorf("workload %d: %+v, want name %s, consumer %s", i, w, wantName, wantConsumer)
		}
		d := specs.Deployment(idc, rc, "img", "h", w)
		if d.Name != wantName {
			t.Errorf("Deployment %d named %s, want %s", i, d.Name, wantName)
		}
		if args := d.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, fmt.Sprintf("--partition=%d", i)) {
			t.Errorf("partition %d's pods run with %v, want --partition=%d", i, args, i)
		}
		sel := d.Spec.Selector.MatchLabels
		if sel[specs.LabelPartition] != fmt.Sprint(i) || d.Spec.Template.Labels[specs.LabelPartition] != fmt.Sprint(i) {
			t.Errorf("partition %d: selector %v, pod labels %v: want %s=%d on both", i, sel, d.Spec.Template.Labels, specs.LabelPartition, i)
		}
		selectors[fmt.Sprint(sel)] = true
		pdb := specs.PodDisruptionBudget(idc, w)
		if pdb.Name != wantName || fmt.Sprint(pdb.Spec.Selector.MatchLabels) != fmt.Sprint(sel) {
			t.Errorf("partition %d's PodDisruptionBudget %s selects %v, want %s selecting %v", i, pdb.Name, pdb.Spec.Selector.MatchLabels, wantName, sel)
		}
		so, _, err := specs.ScaledObject(idc, rc, specs.ScaleHold{}, w)
		if err != nil {
			t.Fatal(err)
		}
		if so.GetName() != wantName || nested(t, so, "spec", "scaleTargetRef", "name") != wantName {
			t.Errorf("partition %d's ScaledObject %s targets %v, want %s", i, so.GetName(), nested(t, so, "spec", "scaleTargetRef", "name"), wantName)
		}
		triggers, _ := nested(t, so, "spec", "triggers").([]any)
		if len(triggers) != 1 || triggers[0].(map[string]any)["metadata"].(map[string]any)["consumer"] != wantConsumer {
			t.Errorf("partition %d's trigger %v, want the lag of consumer %s", i, triggers, wantConsumer)
		}
	}
	if len(selectors) != 3 {
		t.Errorf("the partitions' Deployments share selectors: %v", selectors)
	}
}
