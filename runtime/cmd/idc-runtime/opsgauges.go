package main

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// opsInterval is how often the operational gauges are refreshed: at most
// one cheap query per replica every 15 s.
const opsInterval = 15 * time.Second

// opsGauges are the gauges the alerts in config/prometheus read besides the
// loop's own metrics.
type opsGauges struct {
	// window is the retention window of the last prune run, 0 before the
	// first: IdcInboxOldestNearWindow compares the oldest inbox row with it.
	window prometheus.Gauge
}

// newOpsGauges registers idc_consumer_ready (read from the same check as
// /readyz at scrape time) and idc_retention_window_seconds.
func newOpsGauges(reg prometheus.Registerer, state *loopState) (*opsGauges, error) {
	g := &opsGauges{
		window: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idc_retention_window_seconds",
			Help: "Retention window used by the last prune run of this inbox (0 before the first run).",
		}),
	}
	ready := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "idc_consumer_ready",
		Help: "1 while /readyz passes (database reached, source fetched from, sink not held), else 0.",
	}, func() float64 {
		if state.ready() == nil {
			return 1
		}
		return 0
	})
	for _, c := range []prometheus.Collector{g.window, ready} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("while registering the operational gauges: %w", err)
		}
	}
	return g, nil
}

// refresh updates the gauges every opsInterval until ctx ends. Failures
// keep the last value: a gauge is not worth a log line per 15 s.
func (g *opsGauges) refresh(ctx context.Context, store *inbox.Store, log logr.Logger) {
	t := time.NewTicker(opsInterval)
	defer t.Stop()
	for {
		run, err := store.LastPruneRun(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			log.V(1).Info("Could not read the last prune run", "error", err.Error())
		case run != nil:
			g.window.Set(run.Window.Seconds())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
