package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
	jssource "github.com/idempotency-dev/idc-operator/runtime/source/jetstream"
)

// The JetStream consumer the runtime creates for an autoscaled resource is
// sized for maxReplicas: MaxAckPending = headroom 4 x maxReplicas x
// batchSize x inFlight, from the config the controller renders (the real
// runtime source against the real NATS on loopback).
func TestAutoscaledJetStreamConsumerSizedForMaxReplicas(t *testing.T) {
	nc, err := nats.Connect(natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("NATS JetStream at %s is required (make nats; with IDC_TEST_NATS=system, make services): %v", natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := fmt.Sprintf("IDC_KEDA_LIMITS_%d", time.Now().UnixNano())
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}, MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(context.Background(), stream) }()

	idc := withAutoscaling(unitConsumer(), 1, 6)
	idc.Spec.Source.NATSJetStream.URL, idc.Spec.Source.NATSJetStream.Stream = natsURL, stream
	idc.Spec.Delivery.BatchSize, idc.Spec.Delivery.InFlight = 250, 3
	rc := mustRender(t, idc)
	src, err := jssource.New(ctx, rc.Config.Source.NATSJetStream, testr.New(t), jssource.WithDelivery(rc.Config.Delivery))
	if err != nil {
		t.Fatal(err)
	}
	_ = src.Close()
	c, err := js.Consumer(ctx, stream, idc.Spec.Source.NATSJetStream.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.CachedInfo().Config.MaxAckPending, 4*6*250*3; got != want {
		t.Fatalf("MaxAckPending %d, want headroom 4 x maxReplicas 6 x batchSize 250 x inFlight 3 = %d", got, want)
	}
}

// fakeKEDA answers Installed with a fixed value and counts the questions.
type fakeKEDA struct {
	installed bool
	asked     int
}

func (f *fakeKEDA) Installed(context.Context) (bool, error) { f.asked++; return f.installed, nil }

func (f *fakeKEDA) Forget() {}

// withAutoscaling sets spec.runtime.autoscaling as the API server defaults
// it, replicas left at its default.
func withAutoscaling(idc *messagingv1alpha1.IdempotentConsumer, minR, maxR int32) *messagingv1alpha1.IdempotentConsumer {
	idc.Spec.Runtime.Replicas = ptr.To(int32(1))
	idc.Spec.Runtime.Autoscaling = &messagingv1alpha1.AutoscalingSpec{
		MinReplicas: ptr.To(minR), MaxReplicas: maxR, PollingInterval: "30s", CooldownPeriod: "5m", ScaleDownStabilization: "5m", NATSAccount: "$G",
	}
	return idc
}

// Broker limits follow maxReplicas: the runtime config's replicas (from
// which the runtime sizes the JetStream consumer it creates) and the
// BrokerLimits check both use it, so KEDA can never scale past what the
// consumer was sized for.
func TestBrokerLimitsFollowMaxReplicas(t *testing.T) {
	idc := withAutoscaling(unitConsumer(), 1, 6)
	rc := mustRender(t, idc)
	d := rc.Config.Delivery
	if d.Replicas != 6 {
		t.Fatalf("runtime config replicas = %d, want maxReplicas 6", d.Replicas)
	}
	if got, want := d.SizedUnacked(d.Replicas), 4*6*d.BatchSize*d.InFlight; got != want {
		t.Fatalf("sized MaxAckPending %d, want 4 x 6 x %d x %d = %d", got, d.BatchSize, d.InFlight, want)
	}
	// A consumer sized for 2 replicas is too small for a maxReplicas of 6.
	o := brokerLimitsOutcome(rc.Config, retention.ConsumerLimits{MaxAckPending: d.SizedUnacked(1)})
	if o.ok || o.reason != messagingv1alpha1.ReasonBrokerLimitTooSmall {
		t.Fatalf("limits sized for 1 replica under maxReplicas 6: %+v, want BrokerLimitTooSmall", o)
	}
	if o := brokerLimitsOutcome(rc.Config, retention.ConsumerLimits{MaxAckPending: d.MinUnacked(6)}); !o.ok {
		t.Fatalf("limits for 6 replicas: %+v, want LimitsFit", o)
	}
	// Scaling does not roll the pods: maxReplicas is out of the config hash.
	idc2 := withAutoscaling(unitConsumer(), 1, 9)
	if mustRender(t, idc2).Hash != rc.Hash {
		t.Fatal("a new maxReplicas changed the config hash (it would roll every pod)")
	}
}

// The Deployment's replicas under autoscaling: not applied with KEDA (its
// HPA owns the field), max(minReplicas, 1) without it, 0 while suspended.
func TestDeploymentReplicasUnderAutoscaling(t *testing.T) {
	cases := []struct {
		name      string
		min       int32
		suspend   bool
		installed bool
		want      *int32
	}{
		{"KEDA installed", 2, false, true, nil},
		{"KEDA installed, min 0", 0, false, true, nil},
		{"no KEDA", 2, false, false, ptr.To(int32(2))},
		{"no KEDA, min 0 runs one", 0, false, false, ptr.To(int32(1))},
		{"suspended", 2, true, true, ptr.To(int32(0))},
		{"suspended, no KEDA", 2, true, false, ptr.To(int32(0))},
	}
	for _, c := range cases {
		idc := withAutoscaling(unitConsumer(), c.min, 5)
		idc.Spec.Suspend = c.suspend
		got := deploymentReplicas(idc, c.installed)
		if (got == nil) != (c.want == nil) || (got != nil && *got != *c.want) {
			t.Errorf("%s: replicas %v, want %v", c.name, ptr.Deref(got, -1), ptr.Deref(c.want, -1))
		}
	}
}

func nested(t *testing.T, u *unstructured.Unstructured, fields ...string) any {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(u.Object, fields...)
	if err != nil || !ok {
		t.Fatalf("%s: no field %v (%v)", u.GetKind(), fields, err)
	}
	return v
}

// The ScaledObject's shape besides the trigger: the target, the bounds,
// the timings in seconds, the HPA's scale-down window; paused-replicas 0
// while the sink cannot take the effect.
func TestScaledObjectShape(t *testing.T) {
	idc := withAutoscaling(unitConsumer(), 0, 8)
	idc.Spec.Runtime.Autoscaling.PollingInterval = "1500ms"
	idc.Spec.Runtime.Autoscaling.ScaleDownStabilization = "10s"
	rc := mustRender(t, idc)
	so, ta, err := specs.ScaledObject(idc, rc, specs.ScaleHold{}, specs.Workloads(idc)[0])
	if err != nil {
		t.Fatal(err)
	}
	if ta != nil {
		t.Errorf("a NATS source without credentials for the monitoring endpoint got a TriggerAuthentication %v", ta.Object)
	}
	for path, want := range map[string]any{
		"spec.scaleTargetRef.kind": "Deployment", "spec.scaleTargetRef.name": "orders", "spec.scaleTargetRef.apiVersion": "apps/v1",
		"spec.minReplicaCount": int64(0), "spec.maxReplicaCount": int64(8), "spec.pollingInterval": int64(2), "spec.cooldownPeriod": int64(300),
		"spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.stabilizationWindowSeconds": int64(10),
	} {
		if got := nested(t, so, splitPath(path)...); got != want {
			t.Errorf("%s = %v (%T), want %v", path, got, got, want)
		}
	}
	if so.GetAnnotations()["autoscaling.keda.sh/paused-replicas"] != "" {
		t.Errorf("not paused, yet annotated %v", so.GetAnnotations())
	}
	paused, _, _ := specs.ScaledObject(idc, rc, specs.ScaleHold{Paused: true}, specs.Workloads(idc)[0])
	if paused.GetAnnotations()["autoscaling.keda.sh/paused-replicas"] != "0" {
		t.Errorf("paused: annotations %v, want paused-replicas 0", paused.GetAnnotations())
	}
	// No consumer on the broker yet: minReplicas 0 is held at 1 until the
	// runtime has created it; a declared minimum above 0 is left alone.
	awaiting, _, _ := specs.ScaledObject(idc, rc, specs.ScaleHold{AwaitConsumer: true}, specs.Workloads(idc)[0])
	if got := nested(t, awaiting, "spec", "minReplicaCount"); got != int64(1) {
		t.Errorf("awaiting the consumer: minReplicaCount %v, want 1", got)
	}
	idc.Spec.Runtime.Autoscaling.MinReplicas = ptr.To(int32(3))
	awaiting, _, _ = specs.ScaledObject(idc, rc, specs.ScaleHold{AwaitConsumer: true}, specs.Workloads(idc)[0])
	if got := nested(t, awaiting, "spec", "minReplicaCount"); got != int64(3) {
		t.Errorf("awaiting the consumer with minReplicas 3: minReplicaCount %v, want 3", got)
	}
}

func splitPath(p string) []string {
	var out []string
	start := 0
	for i := range len(p) {
		if p[i] == '.' {
			out = append(out, p[start:i])
			start = i + 1
		}
	}
	return append(out, p[start:])
}

// The status says why KEDA's HPA wants its replicas.
func TestHPAReason(t *testing.T) {
	a := &messagingv1alpha1.AutoscalingSpec{MinReplicas: ptr.To(int32(0)), MaxReplicas: 4, ActivationLag: 0, CooldownPeriod: "10s"}
	hpa := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "keda-hpa-orders"},
		Status: autoscalingv2.HorizontalPodAutoscalerStatus{DesiredReplicas: 4, CurrentMetrics: []autoscalingv2.MetricStatus{{
			Type: autoscalingv2.ExternalMetricSourceType, External: &autoscalingv2.ExternalMetricStatus{Current: autoscalingv2.MetricValueStatus{AverageValue: resource.NewQuantity(7500, resource.DecimalSI)}},
		}}}}
	got := hpaReason(hpa, a, 1000, &kedaCondition{status: "True"})
	want := "KEDA: backlog 7500 per replica (target 1000); HorizontalPodAutoscaler keda-hpa-orders wants 4 of 0..4"
	if got != want {
		t.Fatalf("reason\n%q, want\n%q", got, want)
	}
	idle := hpaReason(&autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "keda-hpa-orders"}}, a, 1000, &kedaCondition{status: "False"})
	if want := "KEDA: no backlog above activationLag 0: KEDA scales to 0 after cooldownPeriod 10s; HorizontalPodAutoscaler keda-hpa-orders wants 0 of 0..4"; idle != want {
		t.Fatalf("idle reason\n%q, want\n%q", idle, want)
	}
}

// Without KEDA the resource says so (KEDANotInstalled, never silently
// ignored), runs max(minReplicas, 1) replicas, renders no ScaledObject, and
// asks discovery through the detector (which caches) once per pass at most.
func TestKEDANotInstalledRunsMinReplicas(t *testing.T) {
	idc := withAutoscaling(unitConsumer(), 0, 4)
	h := newHarness(t, idc)
	keda := &fakeKEDA{installed: false}
	h.r.opts.KEDA = keda
	h.pass()
	res := got(t, h)
	if c := conditionOf(res, messagingv1alpha1.ConditionAutoscaling); c != "False/"+messagingv1alpha1.ReasonKEDANotInstalled {
		t.Fatalf("Autoscaling condition %q, want False/KEDANotInstalled", c)
	}
	var d appsv1.Deployment
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: "orders"}, &d); err != nil {
		t.Fatal(err)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Fatalf("Deployment replicas %v, want 1 (minReplicas 0 without KEDA runs one)", d.Spec.Replicas)
	}
	if res.Status.Runtime == nil || ptr.Deref(res.Status.Runtime.DesiredReplicas, -1) != 1 || res.Status.Runtime.ScaleReason == "" {
		t.Fatalf("status.runtime %+v: want desiredReplicas 1 and a reason", res.Status.Runtime)
	}
	if keda.asked == 0 {
		t.Fatal("the detector was never asked")
	}
	// Without autoscaling the condition goes and KEDA is not asked.
	res.Spec.Runtime.Autoscaling = nil
	res.Spec.Runtime.Replicas = ptr.To(int32(2))
	if err := h.c.Update(context.Background(), res); err != nil {
		t.Fatal(err)
	}
	asked := keda.asked
	h.pass()
	if c := conditionOf(got(t, h), messagingv1alpha1.ConditionAutoscaling); c != "" {
		t.Fatalf("autoscaling off: condition %q still there", c)
	}
	if keda.asked != asked {
		t.Fatal("autoscaling off: KEDA's presence was asked for")
	}
}
