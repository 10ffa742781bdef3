package controllers

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
)

// fieldOwner is the server-side apply field manager of rendered children.
const fieldOwner = client.FieldOwner("idc-operator")

// Options configures the reconciler.
type Options struct {
	// RuntimeImage is the default image of the consumer and prune pods.
	RuntimeImage string
	// AllowedRuntimeImages are the images spec.runtime.image may name
	// (an entry ending in * allows every image it is a prefix of); empty
	// allows RuntimeImage alone. Any other image stalls the resource with
	// ImageNotAllowed: a resource author must not run an image of their
	// choice with the namespace's Secrets through the operator.
	AllowedRuntimeImages []string
	// HTTPDenyNetworks are the CIDRs the http effect never connects to,
	// passed to the runtime in its config (DefaultHTTPDenyNetworks).
	HTTPDenyNetworks []string
	// NoPodDisruptionBudgets turns off the PodDisruptionBudget (maxUnavailable
	// 1) each consumer with more than one replica gets.
	NoPodDisruptionBudgets bool
	// NetworkPolicies gives each consumer a NetworkPolicy that allows its
	// pods egress to DNS and the endpoints the runtime dials only.
	NetworkPolicies bool
	// RetentionPeriod is how often the broker is read (window inputs,
	// limits, lag), and so the longest gap between two passes over a
	// resource (jittered up to 10% later). The last prune run is read on
	// every pass, not on this period.
	RetentionPeriod time.Duration
	// MaxConcurrent reconciles.
	MaxConcurrent int
	// Clock is injected where time matters (shrink-after-elapsed, the
	// broker read's age).
	Clock clock.PassiveClock
	// Sink is the sink database client; defaults to sinkdb.New().
	Sink SinkDB
	// Broker reads the broker; defaults to LiveBroker.
	Broker BrokerObserver
	// RecheckPeriod is how often a resource is checked again while its
	// sink, inbox or broker is not ready (EffectReady or InboxReady False,
	// the broker not read): a fixed period, never controller-runtime's
	// growing per-item backoff, so a GRANT, a migration or a broker that
	// is back is noticed within it (default 20s; each re-check comes at
	// most this long after the last, jittered down by up to 10%).
	RecheckPeriod time.Duration
	// KEDA tells whether KEDA's API is served; defaults to discovery,
	// asked again at most every KEDARecheck (default 1m).
	KEDA        KEDADetector
	KEDARecheck time.Duration
	// DropTimeout bounds how long a deletion waits for a sink database
	// that cannot be reached before it leaves the tables in place and lets
	// the resource go (default 10m).
	DropTimeout time.Duration
	// ClusterID identifies the cluster in an inbox's owner record; empty
	// reads the kube-system namespace's UID (--cluster-id).
	ClusterID string
}

// Reconciler reconciles IdempotentConsumers.
type Reconciler struct {
	client client.Client
	// secrets reads Secrets straight from the API server: caching every
	// Secret of the cluster (Helm releases, certificates...) would make the
	// manager's memory grow with the cluster, not with its own work.
	secrets client.Reader
	// live reads what the label-selected cache cannot see (a child of the
	// same name that someone else created).
	live     client.Reader
	scheme   *runtime.Scheme
	recorder recorder.EventRecorder
	opts     Options
	// memory is what is kept per resource between passes (the broker
	// reading, the sink checks, the applied children, the Secrets read).
	memory *memory
	// cluster is the cluster's identity, read once.
	cluster clusterIdentity
}

// NewReconciler builds the reconciler from a manager.
func NewReconciler(mgr ctrl.Manager, opts Options) *Reconciler {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Sink == nil {
		opts.Sink = sinkdb.New()
	}
	if opts.Broker == nil {
		opts.Broker = LiveBroker{}
	}
	if opts.RecheckPeriod <= 0 {
		opts.RecheckPeriod = DefaultRecheckPeriod
	}
	if opts.RetentionPeriod <= 0 {
		opts.RetentionPeriod = 5 * time.Minute
	}
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = 4
	}
	if opts.DropTimeout <= 0 {
		opts.DropTimeout = 10 * time.Minute
	}
	if opts.KEDARecheck <= 0 {
		opts.KEDARecheck = time.Minute
	}
	if opts.KEDA == nil {
		opts.KEDA = NewDiscoveryKEDA(discovery.NewDiscoveryClientForConfigOrDie(mgr.GetConfig()), opts.Clock, opts.KEDARecheck)
	}
	return &Reconciler{
		client:   mgr.GetClient(),
		secrets:  mgr.GetAPIReader(),
		live:     mgr.GetAPIReader(),
		scheme:   mgr.GetScheme(),
		recorder: mgr.GetEventRecorder("idc-operator"),
		opts:     opts,
		memory:   newMemory(),
	}
}

// +kubebuilder:rbac:groups=messaging.idempotency.dev,resources=idempotentconsumers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=messaging.idempotency.dev,resources=idempotentconsumers/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=messaging.idempotency.dev,resources=idempotentconsumers/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=batch,resources=cronjobs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile is thin: get, hand a deletion to reconcileDelete, else build
// the pass's scope, run the phases and patch the status they project when
// it differs from what was read.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	idc := &messagingv1alpha1.IdempotentConsumer{}
	if err := r.client.Get(ctx, req.NamespacedName, idc); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("consumer", klog.KObj(idc)))
	if !idc.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, idc)
	}
	s := newScope(idc)
	res, err := r.runPhases(ctx, s)
	if err == nil {
		r.recordSink(s)
	}
	if perr := r.patchStatus(ctx, s, err); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	return r.requeue(s, res), nil
}

// forget drops what the manager keeps for a resource that is gone (on
// not-found and after a deletion): its metric series, its memory (the
// broker reading, sink checks, applied children and the Secrets it alone
// read, their credentials) and its pool.
func (r *Reconciler) forget(key types.NamespacedName) {
	forgetResourceSeries(key)
	r.memory.forget(key)
	r.opts.Sink.Release(key.String())
}

// requeue is the earliest of what the phases asked for and the next broker
// read, jittered so that many resources do not read at once. A broker that
// could not be read, or has no consumer yet for a resource that scales from
// 0, is read again within the re-check period.
func (r *Reconciler) requeue(s *scope, res ctrl.Result) ctrl.Result {
	next := r.opts.RetentionPeriod
	if s.reading != nil {
		next = max(s.reading.dueIn(r.opts.Clock.Now(), r.opts.RetentionPeriod, r.opts.RecheckPeriod, awaitsConsumer(s.idc)), time.Second)
	}
	if s.reading == nil || !s.reading.rechecked(awaitsConsumer(s.idc)) {
		next += time.Duration(rand.Float64() * 0.1 * float64(r.opts.RetentionPeriod))
	}
	if res.RequeueAfter > 0 && res.RequeueAfter < next {
		next = res.RequeueAfter
	}
	return ctrl.Result{RequeueAfter: next}
}

// recheck is the requeue of a resource whose sink, inbox or broker is not
// ready: at most RecheckPeriod, jittered down by up to 10% so that many
// resources do not check at once.
func (r *Reconciler) recheck() ctrl.Result {
	d := r.opts.RecheckPeriod
	return ctrl.Result{RequeueAfter: d - time.Duration(rand.Float64()*0.1*float64(d))}
}

// patchStatus projects the conditions from what the pass observed, stamps
// observedGeneration after a pass without error, emits events on
// transitions and writes status, with a merge patch, only when it differs
// from what was read.
func (r *Reconciler) patchStatus(ctx context.Context, s *scope, passErr error) error {
	s.obs.err = passErr
	setConditions(s.idc, &s.obs)
	if passErr == nil {
		s.idc.Status.ObservedGeneration = s.idc.Generation
	}
	if equality.Semantic.DeepEqual(s.before.Status, s.idc.Status) {
		return nil
	}
	r.emitTransitions(s.before, s.idc)
	statusPatches.Inc()
	if err := r.client.Status().Patch(ctx, s.idc, client.MergeFrom(s.before)); err != nil {
		return fmt.Errorf("patching status: %w", err)
	}
	return nil
}
