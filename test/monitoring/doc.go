// Package monitoring tests what config/prometheus ships: the alerts with
// `promtool test rules`, and that every metric the alerts and the Grafana
// dashboard name is exported by a real idc-runtime (run against real
// PostgreSQL and NATS JetStream).
package monitoring
