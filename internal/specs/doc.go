// Package specs renders the children of an IdempotentConsumer: the
// runtime's ConfigMap, the consumer Deployment, the prune CronJob, the
// redrive Job, the PodDisruptionBudget, the NetworkPolicy and KEDA's
// ScaledObject and TriggerAuthentication.
//
// Every renderer is a pure function of plain inputs (the resource, its
// rendered runtime config, the image and the like): no client, no logger,
// no clock. The controller decides what to render and applies it; what a
// child looks like is decided here alone, and each renderer's output is
// pinned by a golden file (testdata/*.golden.yaml; go test -update
// rewrites them).
//
// The package lives under internal/: the renderers are no API of the
// module, and nothing outside the operator imports them.
package specs
