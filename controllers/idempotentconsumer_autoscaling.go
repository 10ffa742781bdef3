package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
	"k8s.io/utils/clock"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// +kubebuilder:rbac:groups=keda.sh,resources=scaledobjects;triggerauthentications,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=get

// kedaHPAPrefix is how KEDA names the HorizontalPodAutoscaler it makes for
// a ScaledObject (keda-hpa-<name>).
const kedaHPAPrefix = "keda-hpa-"

// KEDADetector tells whether KEDA's API (keda.sh/v1alpha1 ScaledObject and
// TriggerAuthentication) is served.
type KEDADetector interface {
	Installed(ctx context.Context) (bool, error)
	// Forget drops what is known: the next Installed asks again (an apply
	// found the API gone).
	Forget()
}

// discoveryKEDA asks the API server's discovery for keda.sh/v1alpha1 at
// most once per ttl, whatever the number of resources and passes: a
// cluster without KEDA costs one discovery request per ttl, not one per
// pass.
type discoveryKEDA struct {
	disc  discovery.DiscoveryInterface
	clock clock.PassiveClock
	ttl   time.Duration

	mu        sync.Mutex
	known     bool
	installed bool
	at        time.Time
}

// NewDiscoveryKEDA detects KEDA through discovery, asking again after ttl.
func NewDiscoveryKEDA(disc discovery.DiscoveryInterface, clk clock.PassiveClock, ttl time.Duration) KEDADetector {
	return &discoveryKEDA{disc: disc, clock: clk, ttl: ttl}
}

func (d *discoveryKEDA) Installed(context.Context) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.clock.Now()
	if d.known && now.Sub(d.at) < d.ttl {
		return d.installed, nil
	}
	list, err := d.disc.ServerResourcesForGroupVersion(specs.GVKScaledObject.GroupVersion().String())
	switch {
	case apierrors.IsNotFound(err):
		d.known, d.installed, d.at = true, false, now
		return false, nil
	case err != nil:
		return false, fmt.Errorf("asking discovery for %s: %w", specs.GVKScaledObject.GroupVersion(), err)
	}
	have := map[string]bool{}
	for _, r := range list.APIResources {
		have[r.Kind] = true
	}
	d.known, d.installed, d.at = true, have[specs.GVKScaledObject.Kind] && have[specs.GVKTriggerAuthentication.Kind], now
	return d.installed, nil
}

func (d *discoveryKEDA) Forget() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.known = false
}

// autoscaled is the resource's autoscaling spec, nil when it scales by
// spec.runtime.replicas.
func autoscaled(idc *messagingv1alpha1.IdempotentConsumer) *messagingv1alpha1.AutoscalingSpec {
	return idc.Spec.Runtime.Autoscaling
}

// replicasWithoutKEDA is what the Deployment runs when autoscaling is
// declared but KEDA is not installed: minReplicas, and 1 for minReplicas
// 0, since nothing would ever wake a consumer at 0.
func replicasWithoutKEDA(a *messagingv1alpha1.AutoscalingSpec) int32 {
	return max(a.MinReplicasOrDefault(), 1)
}
