package main

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
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
	// lag is the broker's backlog for this consumer (retention.Lag), 0
	// until the first read: IdcLagGrowing watches it.
	lag prometheus.Gauge
}

// newOpsGauges registers idc_consumer_ready (read from the same check as
// /readyz at scrape time) and idc_retention_window_seconds.
func newOpsGauges(reg prometheus.Registerer, state *loopState) (*opsGauges, error) {
	g := &opsGauges{
		window: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idc_retention_window_seconds",
			Help: "Retention window used by the last prune run of this inbox (0 before the first run).",
		}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idc_source_lag_messages",
			Help: "The broker's backlog for this consumer (JetStream num_pending+num_ack_pending, Kafka partition lag, RabbitMQ ready+unacked, Redis XINFO GROUPS lag), read every 15s.",
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
	for _, c := range []prometheus.Collector{g.window, g.lag, ready} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("while registering the operational gauges: %w", err)
		}
	}
	return g, nil
}

// refresh updates the gauges every opsInterval until ctx ends. Failures
// keep the last value: a gauge is not worth a log line per 15 s.
func (g *opsGauges) refresh(ctx context.Context, cfg *config.Config, store sink.Inbox, log logr.Logger) {
	t := time.NewTicker(opsInterval)
	defer t.Stop()
	for {
		g.readWindow(ctx, store, log)
		g.readLag(ctx, cfg, log)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (g *opsGauges) readWindow(ctx context.Context, store sink.Inbox, log logr.Logger) {
	run, err := store.LastPruneRun(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		log.V(1).Info("Could not read the last prune run", "error", err.Error())
	case run != nil:
		g.window.Set(run.Window.Seconds())
	}
}

// readLag asks the broker on a connection of its own, so it never competes
// with the loop's.
func (g *opsGauges) readLag(ctx context.Context, cfg *config.Config, log logr.Logger) {
	ctx, cancel := context.WithTimeout(ctx, opsInterval)
	defer cancel()
	n, err := retention.Lag(ctx, cfg, nil)
	if err != nil {
		if ctx.Err() == nil {
			log.V(1).Info("Could not read the source lag", "error", err.Error())
		}
		return
	}
	g.lag.Set(float64(n))
}
