package controllers

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// stateSeries gathers the state collector on its own registry and returns
// "name{labels} value" lines, sorted.
func stateSeries(t *testing.T, c *StateCollector) []string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return seriesLines(families, "")
}

// seriesLines renders the series of families whose name label is name (all
// when name is empty).
func seriesLines(families []*dto.MetricFamily, name string) []string {
	var out []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			keep := name == ""
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
				if l.GetName() == "name" && l.GetValue() == name {
					keep = true
				}
			}
			if keep {
				out = append(out, fmt.Sprintf("%s{%s} %g", f.GetName(), strings.Join(labels, ","), m.GetGauge().GetValue()))
			}
		}
	}
	sort.Strings(out)
	return out
}

func TestStateMetricsOneSeriesPerConditionWithStatusAndReason(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	idc := unitConsumer()
	idc.CreationTimestamp = metav1.NewTime(now.Add(-time.Hour))
	idc.Spec.Runtime.Replicas = ptr.To(int32(3))
	setConditions(idc, &observation{
		secrets: okOutcome(messagingv1alpha1.ReasonReady, ""), inbox: okOutcome(messagingv1alpha1.ReasonProvisioned, ""),
		effect:  failed(messagingv1alpha1.ReasonPermissionDenied, "run GRANT"),
		stalled: failed(messagingv1alpha1.ReasonPermissionDenied, "run GRANT"),
	})
	idc.Status.Runtime = &messagingv1alpha1.RuntimeStatus{Replicas: 0, ReadyReplicas: 0}
	idc.Status.Retention = &messagingv1alpha1.RetentionStatus{Window: "49h"}
	held := metav1.NewTime(now.Add(-3 * time.Hour))
	last := metav1.NewTime(now.Add(-10 * time.Minute))
	idc.Status.LastPrune = &messagingv1alpha1.PruneRunStatus{Time: &last, HeldBack: "replica x stopped", HeldSince: &held}
	other := unitConsumer()
	other.Name, other.UID = "payments", "uid-payments"

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = messagingv1alpha1.AddToScheme(scheme)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(idc, other).WithStatusSubresource(idc).Build()
	if err := c.Status().Update(t.Context(), idc); err != nil {
		t.Fatal(err)
	}
	coll := NewStateCollector(c)
	coll.now = func() time.Time { return now }

	got := stateSeries(t, coll)
	joined := strings.Join(got, "\n")
	for _, want := range []string{
		"idc_resource_condition{condition=EffectReady,name=orders,namespace=shop,reason=PermissionDenied,status=False} 1",
		"idc_resource_condition{condition=Stalled,name=orders,namespace=shop,reason=PermissionDenied,status=True} 1",
		"idc_resource_condition{condition=Reconciling,name=orders,namespace=shop,reason=Ready,status=False} 1",
		"idc_resource_condition{condition=InboxReady,name=orders,namespace=shop,reason=Provisioned,status=True} 1",
		"idc_resource_replicas_desired{name=orders,namespace=shop} 3",
		"idc_resource_replicas{name=orders,namespace=shop} 0",
		"idc_resource_replicas_ready{name=orders,namespace=shop} 0",
		"idc_resource_retention_window_seconds{name=orders,namespace=shop} 176400",
		fmt.Sprintf("idc_resource_last_prune_timestamp_seconds{name=orders,namespace=shop} %g", float64(last.Unix())),
		"idc_resource_prune_interval_seconds{name=orders,namespace=shop} 900",
		fmt.Sprintf("idc_resource_created_timestamp_seconds{name=orders,namespace=shop} %g", float64(now.Add(-time.Hour).Unix())),
		"idc_prune_held_back_seconds{name=orders,namespace=shop} 10800",
		// A resource without status yet: declared replicas, no hold.
		"idc_resource_replicas_desired{name=payments,namespace=shop} 2",
		"idc_prune_held_back_seconds{name=payments,namespace=shop} 0",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("missing %s", want)
		}
	}
	// One series per condition of the resource, never one per status value.
	conditions := 0
	for _, l := range got {
		if strings.HasPrefix(l, "idc_resource_condition{") && strings.Contains(l, "name=orders,") {
			conditions++
		}
	}
	if conditions != len(idc.Status.Conditions) {
		t.Errorf("%d condition series for %d conditions", conditions, len(idc.Status.Conditions))
	}
	if strings.Contains(joined, "retention_window_seconds{name=payments") || strings.Contains(joined, "last_prune_timestamp_seconds{name=payments") {
		t.Error("a window or last prune exported for a resource that has none")
	}

	// A deleted resource's series are gone at the next scrape.
	if err := c.Delete(t.Context(), idc); err != nil {
		t.Fatal(err)
	}
	for _, l := range stateSeries(t, coll) {
		if strings.Contains(l, "name=orders,") {
			t.Errorf("series of a deleted resource: %s", l)
		}
	}
}

func TestPruneInterval(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 7, 0, 0, time.UTC)
	for schedule, want := range map[string]time.Duration{"*/30 * * * *": 30 * time.Minute, "0 3 * * *": 24 * time.Hour, "@hourly": time.Hour} {
		if got, ok := pruneInterval(schedule, now); !ok || got != want {
			t.Errorf("pruneInterval(%q) = %s, %t, want %s", schedule, got, ok, want)
		}
	}
	if _, ok := pruneInterval("not a schedule", now); ok {
		t.Error("an invalid schedule has an interval")
	}
}
