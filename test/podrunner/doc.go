// Package podrunner plays kubelet and the workload controllers for one
// namespace of a control plane that has neither (envtest: a kube-apiserver
// and etcd only, on a machine without a container runtime).
//
// It watches Deployments, Jobs and CronJobs through the API and runs each
// desired pod as a local process: the container's command[0] (a path inside
// the image, such as /idc-runtime) maps to a local executable, and the process
// gets exactly the container's args and env, with
//
//   - secretKeyRef, configMapKeyRef, envFrom and fieldRef (metadata.name is
//     the synthesized pod name) resolved through the API when the process
//     starts, as a kubelet does;
//   - ConfigMap, Secret and emptyDir volumes materialised in a per-pod
//     directory, and every arg, env value or working directory under a
//     mountPath rewritten to that directory;
//   - each container port given a free local port, announced to the process
//     through Options.PortEnv (and Options.RewriteFile for programs that only
//     read their address from a mounted file), and used by the HTTP probes.
//
// Deployments: spec.replicas processes (0 while scaled down), restarted with
// backoff when they exit (restartPolicy Always), all replaced when the pod
// template changes (a new config-hash annotation restarts the pods), readiness
// from the readinessProbe, liveness failures kill the process. Status goes
// back through the /status subresource: observedGeneration, replicas,
// updated, ready, available and unavailable replicas, and the Available and
// Progressing conditions, written only when they change.
//
// Jobs (one completion, parallelism 1): one process, retried with backoff up
// to backoffLimit failures; activeDeadlineSeconds is enforced; status has
// startTime, active, ready, succeeded, failed, completionTime and the
// SuccessCriteriaMet/Complete or FailureTarget/Failed conditions the API
// server requires.
//
// CronJobs: there is no CronJob controller, so TriggerCronJob creates a Job
// from a CronJob's jobTemplate on demand (like kubectl create job --from);
// with Options.RunSchedules the runner also creates them on schedule
// (concurrencyPolicy Forbid honoured, suspend honoured).
//
// Not modelled: init and sidecar containers (refused), more than one
// container per pod (refused), startup probes, minReadySeconds, surge
// accounting during a rollout (old pods are stopped while the new ones start),
// indexed or parallel Jobs, resource limits, security contexts.
package podrunner
