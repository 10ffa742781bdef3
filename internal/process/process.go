// Package process is the process setup the repository's three binaries
// share (cmd/manager, cmd/idc-runtime, cmd/kubectl-idc): the Go collector's
// settings from the container's memory limit, the signals that stop a
// process, and the runtime's JSON logger.
//
// Memory (SetMemory): GOGC is set to the binary's own default unless the
// environment sets GOGC, and the soft memory limit (GOMEMLIMIT) to
// SoftLimitRatio of the container's cgroup limit (v2 memory.max, then v1
// memory.limit_in_bytes) unless the environment sets GOMEMLIMIT. No cgroup
// file, "max" and v1's page-rounded maximum all mean no limit, and so no
// soft limit. A cgroup file that exists but cannot be read or parsed is never
// fatal: the process runs without a soft limit (GOGC is still set) and
// SetMemory returns the error, naming the file, for the caller to log. A
// process that cannot read its limit is no worse off than one without a
// limit, so refusing to start over it would only turn a diagnostic into an
// outage.
//
// Signals (SignalContext): the first SIGTERM or SIGINT cancels the context,
// so the process finishes what is in flight and exits on its own; a second
// one kills it at once (the default action).
//
// Logging (NewLogger) is the runtime's: one JSON object a line on stderr,
// which the pods' log collectors read. The manager logs through
// controller-runtime's zap logger instead, because its --zap-* flags are part
// of the manager's interface (the chart's extraArgs); that setup stays in
// cmd/manager so that neither the runtime nor the kubectl plugin links zap.
// The plugin prints to its terminal and sets up no logger.
package process
