// Package benchcontroller benchmarks the control plane at scale: the real
// manager binary, run as a subprocess against envtest's kube-apiserver and
// etcd, brings N IdempotentConsumers (300 by default, IDC_BENCH_RESOURCES)
// on one PostgreSQL database and one NATS JetStream stream to Ready. The
// benchmark plays the Deployment controller, which envtest does not run, and
// prints
//
//	BENCH controller resources=<n> seconds_to_ready=<s> manager_rss_mib=<m>
//
// where seconds_to_ready runs from the first create to the last Ready=True
// and manager_rss_mib is the manager process's peak resident set (VmHWM).
// Before the manager starts, the same run measures the controller's floor
// (floor_test.go; IDC_BENCH_FLOOR=0 skips it) and prints
//
//	BENCH controller_cost resources=<n> cpu_s=<s> manager_cpu_ms_per_resource=<ms> requests_per_resource: <verb>=<n> ...
//	BENCH controller_floor resources=<n> seconds_to_done=<s> cpu_s=<s> ...
//	RATIO controller_vs_floor=<seconds_to_ready / seconds_to_done>
//	RATIO controller_cpu_vs_floor=<cpu_s / floor cpu_s>
//
// Run it with make bench-controller; it needs PostgreSQL on 127.0.0.1:5432
// (IDC_TEST_PG_DSN overrides the maintenance connection) and NATS JetStream
// on 127.0.0.1:4222 (IDC_TEST_NATS_URL overrides it).
package benchcontroller
