// Command manager runs the idc-operator controller manager.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers"
	"github.com/idempotency-dev/idc-operator/internal/metricsauth"
	"github.com/idempotency-dev/idc-operator/internal/process"
	"github.com/idempotency-dev/idc-operator/runtime/version"
)

// defaultGCPercent is the manager's GOGC when the environment sets none. Its
// live heap is small (about 30 MiB with 1,000 resources) and mostly idle, so
// the collector's default of 100 (a heap allowed to reach twice the live
// data) is what sizes its memory; 50 keeps the peak resident size about 15
// MiB lower at 1,000 resources for a few percent more CPU during a burst of
// creations. Prometheus picks its own GOGC the same way.
const defaultGCPercent = 50

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		metricsAddr, probeAddr, watchNamespaces, runtimeImage string
		pprofAddr, allowedImages, httpDeny                    string
		leaderElect, secureMetrics, enableHTTP2               bool
		podDisruptionBudgets, networkPolicies                 bool
		retentionPeriod, dropTimeout, recheckPeriod           time.Duration
		clusterID                                             string
		maxConcurrent, apiBurst                               int
		apiQPS                                                float64
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "Address of the metrics endpoint (:8443 for HTTPS, :8080 for HTTP, 0 to disable).")
	flag.BoolVar(&secureMetrics, "metrics-secure", true, "Serve metrics over HTTPS with authentication and authorization.")
	flag.BoolVar(&enableHTTP2, "enable-http2", false, "Enable HTTP/2 for the metrics server (off: CVE-2023-44487, CVE-2023-39325).")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz.")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "", "Address of Go's /debug/pprof endpoints (e.g. 127.0.0.1:6060); empty disables them.")
	flag.BoolVar(&leaderElect, "leader-elect", false, "Elect a leader so only one manager reconciles.")
	flag.StringVar(&watchNamespaces, "watch-namespaces", "", "Comma-separated namespaces to watch; empty watches all.")
	flag.StringVar(&runtimeImage, "runtime-image", os.Getenv("RUNTIME_IMAGE"), "Default runtime image (env RUNTIME_IMAGE).")
	flag.StringVar(&allowedImages, "allowed-runtime-images", "", "Comma-separated images spec.runtime.image may name (an entry ending in * allows every image it prefixes); empty allows the runtime image alone. Any other image stalls the resource with ImageNotAllowed.")
	flag.StringVar(&httpDeny, "http-deny-networks", strings.Join(controllers.DefaultHTTPDenyNetworks, ","), "Comma-separated CIDRs the http effect never connects to (checked on the dialled address, after DNS); empty denies none.")
	flag.BoolVar(&podDisruptionBudgets, "pod-disruption-budgets", true, "Give each consumer with more than one replica a PodDisruptionBudget (maxUnavailable 1).")
	flag.BoolVar(&networkPolicies, "network-policies", false, "Give each consumer a NetworkPolicy allowing its pods egress to DNS and the endpoints the runtime dials only (its database, brokers, http endpoint).")
	flag.DurationVar(&retentionPeriod, "retention-period", 5*time.Minute, "How often the retention window is re-derived from the broker; a resource is reconciled at least this often (up to 10% later, jittered). The last prune run is read back on every pass, also one its prune CronJob's change wakes.")
	flag.DurationVar(&recheckPeriod, "recheck-period", controllers.DefaultRecheckPeriod, "How often a resource whose sink, inbox or broker is not ready is checked again (a fixed period, at most 30s; never a growing backoff).")
	flag.StringVar(&clusterID, "cluster-id", "", "The cluster's identity in each inbox's owner record; empty reads the kube-system namespace's UID (a namespaced install that may not read it records \"unknown\"). Set it when clusters share a sink database and cannot read kube-system.")
	flag.IntVar(&maxConcurrent, "max-concurrent-reconciles", 4, "IdempotentConsumers reconciled in parallel.")
	flag.DurationVar(&dropTimeout, "drop-timeout", 10*time.Minute, "How long a deletion with deletionPolicy Delete retries an unreachable sink database before it leaves the tables in place (with a Warning event) and lets the resource go.")
	flag.Float64Var(&apiQPS, "kube-api-qps", 0, "Client-side limit of requests per second to the Kubernetes API server; 0 sets none and leaves it to the API server's priority and fairness.")
	flag.IntVar(&apiBurst, "kube-api-burst", 0, "Burst of requests above --kube-api-qps (with a limit set).")
	showVersion := flag.Bool("version", false, "Print the version and exit.")
	opts := zap.Options{Development: false}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(version.String())
		return nil
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	setupLog := ctrl.Log.WithName("setup")
	mem, err := process.SetMemory(defaultGCPercent)
	if err != nil {
		setupLog.Error(err, "cannot read the container's memory limit; running without a soft memory limit")
	}
	// 0 means the environment's GOGC / GOMEMLIMIT, or no container limit.
	setupLog.Info("Go collector", "gcPercentSet", mem.GCPercent, "softMemoryLimitSet", mem.SoftLimit)

	if runtimeImage == "" {
		return fmt.Errorf("no runtime image: set --runtime-image or RUNTIME_IMAGE")
	}
	for _, n := range splitList(httpDeny) {
		if _, err := netip.ParsePrefix(n); err != nil {
			return fmt.Errorf("--http-deny-networks: %q is not a CIDR (e.g. 169.254.0.0/16)", n)
		}
	}
	if recheckPeriod <= 0 || recheckPeriod > 30*time.Second {
		return fmt.Errorf("--recheck-period %s: want more than 0 and at most 30s", recheckPeriod)
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(messagingv1alpha1.AddToScheme(scheme))

	var tlsOpts []func(*tls.Config)
	if !enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	metricsOpts := metricsserver.Options{BindAddress: metricsAddr, SecureServing: secureMetrics, TLSOpts: tlsOpts}
	if secureMetrics {
		metricsOpts.FilterProvider = metricsauth.New
	}
	namespaces, err := controllers.WatchNamespaces(watchNamespaces)
	if err != nil {
		return err
	}
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading the kubeconfig: %w", err)
	}
	if apiQPS > 0 {
		restCfg.QPS, restCfg.Burst = float32(apiQPS), max(apiBurst, int(apiQPS))
	}
	// A CRD older than this manager (a Helm upgrade leaves crds/ as it
	// was) is refused before anything is reconciled against it.
	crdCtx, crdCancel := context.WithTimeout(context.Background(), 30*time.Second)
	skipped, err := controllers.CheckInstalledCRD(crdCtx, restCfg)
	crdCancel()
	if err != nil {
		_ = os.WriteFile("/dev/termination-log", []byte(err.Error()), 0o644) // kubectl describe pod shows it
		return err
	} else if skipped {
		ctrl.Log.WithName("setup").Info("Not allowed to read the CRD " + controllers.CRDName + ": its version is not checked against this manager's")
	}

	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsOpts,
		HealthProbeBindAddress: probeAddr,
		PprofBindAddress:       pprofAddr,
		LeaderElection:         leaderElect,
		LeaderElectionID:       "idc-operator.messaging.idempotency.dev",
		Cache:                  controllers.CacheOptions(namespaces),
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	controllers.RegisterMetrics(ctrlmetrics.Registry)
	r := controllers.NewReconciler(mgr, controllers.Options{
		RuntimeImage:    runtimeImage,
		RetentionPeriod: retentionPeriod,
		MaxConcurrent:   maxConcurrent,
		DropTimeout:     dropTimeout,
		RecheckPeriod:   recheckPeriod,
		ClusterID:       clusterID,

		AllowedRuntimeImages: splitList(allowedImages),
		HTTPDenyNetworks:     splitList(httpDeny),

		NoPodDisruptionBudgets: !podDisruptionBudgets,
		NetworkPolicies:        networkPolicies,
	})
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	// Ready once the informer caches have synced, so a new leader does not
	// report ready while it still reads an empty cache.
	cacheSynced := func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), 100*time.Millisecond)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("informer caches not synced yet")
		}
		return nil
	}
	if err := mgr.AddReadyzCheck("readyz", cacheSynced); err != nil {
		return fmt.Errorf("adding the ready check: %w", err)
	}
	setupLog.Info("starting manager", "version", version.String(), "runtimeImage", runtimeImage, "watchNamespaces", watchNamespaces)
	ctx, stop := process.SignalContext()
	defer stop()
	return mgr.Start(ctx)
}

// splitList splits a comma-separated flag value, dropping empty entries.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
