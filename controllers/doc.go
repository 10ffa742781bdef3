// Package controllers holds the IdempotentConsumer reconciler.
//
// A pass is thin (controller.go): read the resource, hand a deletion to
// reconcileDelete (delete.go), else build the pass's scope (scope.go), run
// the phases in the order of the phase list (phases.go) and patch the
// status they project (conditions.go, events.go) when it changed. What the
// manager keeps of a resource between passes is in one memory (memory.go),
// dropped by one forget on not-found and after a deletion.
//
// Files are named after the one concern they hold:
//   - phase_<name>.go is the phase of that name in the phase list (dashes
//     as underscores: phase_last_prune.go is "last-prune"), with what only
//     it uses; phase_<name>_test.go and phase_<name>_envtest_test.go test it.
//   - the children are rendered by internal/specs (pure functions, golden
//     files); apply.go applies them, refused.go turns a refusal into a
//     condition.
//   - config.go renders the runtime config from the spec; sink.go,
//     sink_memo.go, broker.go, broker_limits.go, keda.go and lag.go are the
//     external systems as the phases see them; watches.go and cache.go set
//     up the controller; metrics.go holds the controller-wide metrics
//     (RegisterMetrics), state_metrics.go the per-resource state collector.
//
// Tests ending in _envtest_test.go need envtest (KUBEBUILDER_ASSETS): the
// Ginkgo suite's specs (TestControllers, suite_test.go, against envtest and
// the loopback services) and a few plain tests that start their own API
// server with KEDA's CRDs. The others are plain Go tests, most on the
// fake-client harness (harness_test.go).
package controllers
