package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
	"k8s.io/utils/clock"

	"github.com/idempotency-dev/idc-operator/internal/specs"
)

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
