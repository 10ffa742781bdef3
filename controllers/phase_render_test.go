package controllers

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// A resource naming a runtime image the manager does not allow stalls with
// ImageNotAllowed and nothing is deployed: no Deployment, no CronJob, no
// ConfigMap. The manager's own image, and one an allow-list entry ending in
// * covers, deploy.
func TestRefusedRuntimeImage(t *testing.T) {
	idc := unitConsumer()
	idc.Spec.Runtime.Image = "registry.example/attacker/miner:latest"
	h := newHarness(t, idc)
	got, _ := h.pass()
	if c := conditionOf(got, messagingv1alpha1.ConditionStalled); c != "True/"+messagingv1alpha1.ReasonImageNotAllowed {
		t.Fatalf("Stalled = %s, want True/ImageNotAllowed", c)
	}
	msg := meta.FindStatusCondition(got.Status.Conditions, messagingv1alpha1.ConditionStalled).Message
	for _, s := range []string{`"registry.example/attacker/miner:latest"`, "idc-operator:test", "--allowed-runtime-images"} {
		if !strings.Contains(msg, s) {
			t.Errorf("Stalled message %q does not name %q", msg, s)
		}
	}
	ctx := context.Background()
	for _, list := range []client.ObjectList{&appsv1.DeploymentList{}, &batchv1.CronJobList{}, &corev1.ConfigMapList{}} {
		if err := h.c.List(ctx, list, client.InNamespace("shop")); err != nil {
			t.Fatal(err)
		}
		if n := meta.LenList(list); n != 0 {
			t.Fatalf("%d %T deployed for a refused image", n, list)
		}
	}

	// Allowed by a prefix entry: it deploys.
	h.r.opts.AllowedRuntimeImages = []string{"idc-operator:test", "registry.example/attacker/*"}
	h.pass()
	var d appsv1.Deployment
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "orders"}, &d); err != nil {
		t.Fatalf("an allowed image is not deployed: %v", err)
	}
	if img := d.Spec.Template.Spec.Containers[0].Image; img != idc.Spec.Runtime.Image {
		t.Fatalf("deployed image %q", img)
	}
}

func TestImageAllowed(t *testing.T) {
	own := "idc-operator:0.2.0"
	for _, tc := range []struct {
		image   string
		allowed []string
		want    bool
	}{
		{own, nil, true},
		{"idc-operator:0.1.0", nil, false},
		{"idc-operator:0.1.0", []string{own}, false},
		{"idc-operator:0.1.0", []string{"idc-operator:*"}, true},
		{"idc-operator-evil:1", []string{"idc-operator:*"}, false},
		{own, []string{"other:1"}, false},
	} {
		if got := imageAllowed(tc.image, tc.allowed, own); got != tc.want {
			t.Errorf("imageAllowed(%q, %v) = %v, want %v", tc.image, tc.allowed, got, tc.want)
		}
	}
}

// The manager's http deny list reaches the runtime through the rendered
// config of an http effect (and only of one).
func TestHTTPDenyNetworksRendered(t *testing.T) {
	idc := unitConsumer()
	idc.Spec.Sink.Effect = messagingv1alpha1.EffectSpec{HTTP: &messagingv1alpha1.HTTPEffect{URL: "https://billing.example/charge"}}
	h := newHarness(t, idc)
	h.r.opts.HTTPDenyNetworks = DefaultHTTPDenyNetworks
	h.pass()
	var cm corev1.ConfigMap
	if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: "shop", Name: specs.ConfigMapName(idc)}, &cm); err != nil {
		t.Fatal(err)
	}
	var cfg config.Config
	for _, v := range cm.Data {
		if err := json.Unmarshal([]byte(v), &cfg); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.Sink.Effect.HTTP == nil || strings.Join(cfg.Sink.Effect.HTTP.DenyNetworks, ",") != strings.Join(DefaultHTTPDenyNetworks, ",") {
		t.Fatalf("rendered http effect %+v, want the deny list %v", cfg.Sink.Effect.HTTP, DefaultHTTPDenyNetworks)
	}
}

// insecureSkipVerify raises one Warning event per spec generation and says
// so in the Ready condition's message.
func TestInsecureSkipVerifyWarns(t *testing.T) {
	idc := unitConsumer()
	idc.Spec.Source.NATSJetStream.TLS = &messagingv1alpha1.TLSSpec{InsecureSkipVerify: true}
	h := newHarness(t, idc)
	rec := events.NewFakeRecorder(100)
	h.r.recorder = rec
	got, _ := h.pass()
	h.pass()
	ready := meta.FindStatusCondition(got.Status.Conditions, messagingv1alpha1.ConditionReady)
	if ready == nil || !strings.Contains(ready.Message, "spec.source.natsJetStream.tls.insecureSkipVerify") {
		t.Fatalf("Ready = %+v, want a message naming the insecure field", ready)
	}
	close(rec.Events)
	n := 0
	for e := range rec.Events {
		if strings.HasPrefix(e, "Warning "+eventInsecureSkipVerify) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d InsecureSkipVerify events over two passes of one generation, want 1", n)
	}
}

func TestValidateSQLParams(t *testing.T) {
	for _, tc := range []struct {
		stmt   string
		params map[string]string
		want   string
	}{
		{"UPDATE a SET n = :n WHERE id = :id", map[string]string{"n": "$.n", "id": "$.id"}, ""},
		{"UPDATE a SET n = :n WHERE id = :id", map[string]string{"n": "$.n"}, ":id"},
		{"UPDATE a SET n = 1 WHERE id = :id", map[string]string{"id": "$.id", "extra": "$.x"}, "params.extra"},
	} {
		cfg := &config.Config{Sink: config.Sink{Effect: config.Effect{SQL: &config.SQL{Statement: tc.stmt, Params: tc.params}}}}
		err := validateSQLParams(cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q %v: %v", tc.stmt, tc.params, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q %v: error %v, want one naming %s", tc.stmt, tc.params, err, tc.want)
		}
	}
}
