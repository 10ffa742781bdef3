package controllers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// FinalizerDropInbox guards the inbox tables of a resource whose
// deletionPolicy is Delete: they are dropped before the resource goes.
const FinalizerDropInbox = "messaging.idempotency.dev/drop-inbox"

// fieldOwner is the server-side apply field manager of rendered children.
const fieldOwner = client.FieldOwner("idc-operator")

// Options configures the reconciler.
type Options struct {
	// RuntimeImage is the default image of the consumer and prune pods.
	RuntimeImage string
	// RetentionPeriod is how often the window is re-derived and the last
	// prune run read back.
	RetentionPeriod time.Duration
	// MaxConcurrent reconciles.
	MaxConcurrent int
	// Clock is injected where time matters (shrink-after-elapsed).
	Clock clock.PassiveClock
	// Inbox provisions the tables; defaults to PostgresInbox.
	Inbox InboxClient
	// Retention derives the window from the broker; defaults to BrokerRetention.
	Retention RetentionDeriver
	// Effect checks the sink before the runtime is deployed; defaults to
	// PostgresEffect on the inbox client's pools.
	Effect EffectChecker
	// EffectRecheck is how often the effect is checked again while
	// EffectReady is False (default 20s, jittered; keep it <= 27s).
	EffectRecheck time.Duration
}

// Reconciler reconciles IdempotentConsumers.
type Reconciler struct {
	client client.Client
	// secrets reads Secrets straight from the API server: caching every
	// Secret of the cluster (Helm releases, certificates...) would make the
	// manager's memory grow with the cluster, not with its own work.
	secrets  client.Reader
	scheme   *runtime.Scheme
	recorder recorder.EventRecorder
	opts     Options
}

// NewReconciler builds the reconciler from a manager.
func NewReconciler(mgr ctrl.Manager, opts Options) *Reconciler {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Inbox == nil {
		opts.Inbox = NewPostgresInbox()
	}
	if opts.Effect == nil {
		pools, ok := opts.Inbox.(*PostgresInbox)
		if !ok {
			pools = NewPostgresInbox()
		}
		opts.Effect = NewPostgresEffect(pools)
	}
	if opts.EffectRecheck <= 0 {
		opts.EffectRecheck = defaultEffectRecheck
	}
	if opts.Retention == nil {
		opts.Retention = BrokerRetention{}
	}
	if opts.RetentionPeriod <= 0 {
		opts.RetentionPeriod = 5 * time.Minute
	}
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = 4
	}
	return &Reconciler{
		client:   mgr.GetClient(),
		secrets:  mgr.GetAPIReader(),
		scheme:   mgr.GetScheme(),
		recorder: mgr.GetEventRecorder("idc-operator"),
		opts:     opts,
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

// Reconcile is thin: get, handle deletion, ensure the finalizer, run the
// phases in order, and compute status once in a defer.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	idc := &messagingv1alpha1.IdempotentConsumer{}
	if err := r.client.Get(ctx, req.NamespacedName, idc); err != nil {
		if apierrors.IsNotFound(err) {
			forgetBrokerLimits(req.Namespace, req.Name)
			forgetPruneHeldBack(req.Namespace, req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("consumer", klog.KObj(idc)))
	if !idc.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileDelete(ctx, idc)
	}
	if err := r.ensureFinalizer(ctx, idc); err != nil {
		return ctrl.Result{}, err
	}

	before := idc.DeepCopy()
	obs := &observation{}
	defer func() {
		obs.err = retErr
		if err := r.patchStatus(ctx, before, idc, obs); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()
	if err := r.reconcilePhases(ctx, idc, obs); err != nil {
		return ctrl.Result{}, err
	}
	requeue := jitter(r.opts.RetentionPeriod)
	if d := r.effectRequeue(obs); d > 0 {
		requeue = min(requeue, d)
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// reconcilePhases runs the phases in order; the first that cannot proceed
// stops the pass (its outcome explains why).
func (r *Reconciler) reconcilePhases(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, obs *observation) error {
	idc.Status.Source = sourceSummary(idc)
	idc.Status.Guarantee = guaranteeFor(idc)
	rc, err := renderConfig(idc)
	if err == nil {
		err = validateSQLParams(rc.Config)
	}
	if err != nil {
		obs.stalled = failed(messagingv1alpha1.ReasonInvalidSpec, err.Error())
		return nil
	}
	conflict, err := r.findConflict(ctx, idc)
	if err != nil {
		return err
	}
	if conflict != "" {
		obs.stalled = failed(messagingv1alpha1.ReasonConflict, conflict)
		return nil
	}
	secrets, err := r.resolveSecrets(ctx, idc, rc)
	var se *secretError
	if errors.As(err, &se) {
		obs.secrets = failed(se.reason, se.message)
		// The Secret watch brings us back when it appears; the error keeps a
		// backoff retry in case the watch is not enough.
		return err
	}
	if err != nil {
		return err
	}
	obs.secrets = okOutcome(messagingv1alpha1.ReasonReady, "all referenced Secrets found")

	if err := r.reconcileInbox(ctx, idc, rc, secrets, obs); err != nil {
		return err
	}
	if err := r.reconcileEffect(ctx, idc, rc, secrets, obs); err != nil {
		return err
	}
	window := r.reconcileRetention(ctx, idc, rc, secrets, obs)
	if err := r.reconcileChildren(ctx, idc, rc, secrets, window, obs); err != nil {
		return err
	}
	r.readLastPrune(ctx, idc, rc, secrets, obs)
	r.readLag(ctx, idc, rc, secrets)
	r.readOutbox(ctx, idc, rc, secrets)
	r.reportIDConflicts(ctx, idc, rc, secrets, obs)
	return r.reconcileRedrive(ctx, idc, rc, secrets, runtimeImageFor(idc, r.opts.RuntimeImage))
}

func (r *Reconciler) reconcileInbox(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, rc *renderedConfig, secrets *resolvedSecrets, obs *observation) error {
	version, err := r.opts.Inbox.Ensure(ctx, secrets.getenv(envPostgresDSN), rc.Config.Sink)
	if err != nil {
		reason, msg := classifyDBError(err, idc.Spec.Sink.Postgres.ConnectionSecretRef)
		obs.inbox = failed(reason, msg)
		return fmt.Errorf("provisioning the inbox: %s", msg)
	}
	idc.Status.Inbox = inboxStatusFor(rc.Config, version)
	obs.inbox = okOutcome(messagingv1alpha1.ReasonProvisioned,
		fmt.Sprintf("inbox %s (layout %s, schema version %d) and its dead-letter and prune-run tables exist", idc.Status.Inbox.Table, rc.Config.Sink.Layout, version))
	return nil
}

// reconcileChildren applies the ConfigMap, Deployment and CronJob and reads
// the Deployment's availability.
func (r *Reconciler) reconcileChildren(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, rc *renderedConfig, secrets *resolvedSecrets, window time.Duration, obs *observation) error {
	image := runtimeImageFor(idc, r.opts.RuntimeImage)
	dep := renderDeployment(idc, rc, image, secrets.hash)
	if !obs.effect.ok {
		// Nothing may be fetched until the sink can take the effect.
		dep.Spec.Replicas = ptr.To(int32(0))
	}
	children := []client.Object{renderConfigMap(idc, rc), dep, renderCronJob(idc, rc, image, secrets.hash, window)}
	for _, obj := range children {
		if err := r.apply(ctx, idc, obj); err != nil {
			var ce *conflictError
			if errors.As(err, &ce) {
				obs.stalled = failed(messagingv1alpha1.ReasonConflict, ce.Error())
				return nil
			}
			return err
		}
	}

	// The cache may not have seen a Deployment created a moment ago; the
	// Owns watch brings us back when it does.
	var live appsv1.Deployment
	if err := r.client.Get(ctx, client.ObjectKeyFromObject(dep), &live); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("reading the Deployment back: %w", err)
	}
	idc.Status.Runtime = &messagingv1alpha1.RuntimeStatus{
		Deployment: dep.Name, Replicas: live.Status.Replicas, ReadyReplicas: live.Status.ReadyReplicas, Selector: selectorFor(idc),
	}
	obs.runtime = runtimeOutcome(idc, &live)
	if !obs.effect.ok && !idc.Spec.Suspend {
		obs.runtime = failed(messagingv1alpha1.ReasonWaitingForEffect,
			fmt.Sprintf("the Deployment is held at 0 replicas until EffectReady is True (%s)", obs.effect.reason))
	}
	obs.prune = pruneOutcome(idc, window)
	return nil
}

func runtimeOutcome(idc *messagingv1alpha1.IdempotentConsumer, d *appsv1.Deployment) outcome {
	if idc.Spec.Suspend {
		return okOutcome(messagingv1alpha1.ReasonSuspended, "spec.suspend is true: the runtime is scaled to 0 replicas")
	}
	if d.UID == "" {
		return failed(messagingv1alpha1.ReasonDeploymentNotReady, "the Deployment was just created; waiting for it to report status")
	}
	if ok, msg := deploymentAvailable(d); ok {
		return okOutcome(messagingv1alpha1.ReasonReady, msg)
	} else {
		return failed(messagingv1alpha1.ReasonDeploymentNotReady, msg)
	}
}

func pruneOutcome(idc *messagingv1alpha1.IdempotentConsumer, window time.Duration) outcome {
	if suspended, why := pruneSuspended(idc, window); suspended {
		reason := messagingv1alpha1.ReasonWaitingForWindow
		if idc.Spec.Retention.Prune.Suspend {
			reason = messagingv1alpha1.ReasonPruneSuspended
		}
		return failed(reason, "the prune CronJob is suspended: "+why)
	}
	return okOutcome(messagingv1alpha1.ReasonScheduled,
		fmt.Sprintf("prune runs on %q and deletes ids older than %s", idc.Spec.Retention.Prune.Schedule, window))
}

// conflictError is a child object of the same name that another owner holds.
type conflictError struct{ kind, name, owner string }

func (e *conflictError) Error() string {
	return fmt.Sprintf("%s %q exists and is not owned by this IdempotentConsumer (owner: %s); rename or delete it", e.kind, e.name, e.owner)
}

// apply server-side-applies a rendered child owned by idc. An apply that
// changes nothing writes nothing, so steady state causes no events.
func (r *Reconciler) apply(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, obj client.Object) error {
	gvk := obj.GetObjectKind().GroupVersionKind()
	existing := obj.DeepCopyObject().(client.Object)
	err := r.client.Get(ctx, client.ObjectKeyFromObject(obj), existing)
	if err == nil && !metav1.IsControlledBy(existing, idc) {
		owner := "none"
		if ref := metav1.GetControllerOf(existing); ref != nil {
			owner = ref.Kind + "/" + ref.Name
		}
		return &conflictError{kind: gvk.Kind, name: obj.GetName(), owner: owner}
	}
	if err := controllerutil.SetControllerReference(idc, obj, r.scheme); err != nil {
		return fmt.Errorf("owning %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("converting %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	un := unstructuredOf(u, gvk)
	if err := r.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(un), fieldOwner, client.ForceOwnership); err != nil {
		return fmt.Errorf("applying %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	return nil
}

func (r *Reconciler) ensureFinalizer(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer) error {
	want := idc.Spec.Sink.Inbox.DeletionPolicy == messagingv1alpha1.DeletionPolicyDelete
	has := controllerutil.ContainsFinalizer(idc, FinalizerDropInbox)
	if want == has {
		return nil
	}
	patch := client.MergeFrom(idc.DeepCopy())
	if want {
		controllerutil.AddFinalizer(idc, FinalizerDropInbox)
	} else {
		controllerutil.RemoveFinalizer(idc, FinalizerDropInbox)
	}
	if err := r.client.Patch(ctx, idc, patch); err != nil {
		return fmt.Errorf("updating the finalizer: %w", err)
	}
	return nil
}

// reconcileDelete drops the tables when deletionPolicy is Delete, then lets
// the resource go. Retain adds no finalizer, so it never gets here with one.
func (r *Reconciler) reconcileDelete(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer) error {
	if !controllerutil.ContainsFinalizer(idc, FinalizerDropInbox) {
		return nil
	}
	if err := r.dropInbox(ctx, idc); err != nil {
		r.recorder.Eventf(idc, nil, corev1.EventTypeWarning, "InboxUnavailable", "DropInbox", "dropping the inbox tables failed, retrying: %s", err.Error())
		return err
	}
	patch := client.MergeFrom(idc.DeepCopy())
	controllerutil.RemoveFinalizer(idc, FinalizerDropInbox)
	if err := r.client.Patch(ctx, idc, patch); err != nil {
		return fmt.Errorf("removing the finalizer: %w", err)
	}
	return nil
}

// patchStatus computes conditions from the observation, stamps
// observedGeneration after a successful pass, emits events on transitions and
// writes status with a merge patch.
func (r *Reconciler) patchStatus(ctx context.Context, before, idc *messagingv1alpha1.IdempotentConsumer, obs *observation) error {
	setConditions(idc, obs)
	if obs.err == nil {
		idc.Status.ObservedGeneration = idc.Generation
	}
	r.emitTransitions(before, idc)
	if err := r.client.Status().Patch(ctx, idc, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("patching status: %w", err)
	}
	return nil
}

// transitionEvents maps a condition becoming True or False to an event.
var transitionEvents = []struct {
	condition string
	status    metav1.ConditionStatus
	eventType string
	reason    string
}{
	{messagingv1alpha1.ConditionInboxReady, metav1.ConditionTrue, corev1.EventTypeNormal, "Provisioned"},
	{messagingv1alpha1.ConditionInboxReady, metav1.ConditionFalse, corev1.EventTypeWarning, "InboxUnavailable"},
	{messagingv1alpha1.ConditionEffectReady, metav1.ConditionTrue, corev1.EventTypeNormal, "EffectReady"},
	{messagingv1alpha1.ConditionEffectReady, metav1.ConditionFalse, corev1.EventTypeWarning, "EffectNotReady"},
	{messagingv1alpha1.ConditionRuntimeReady, metav1.ConditionTrue, corev1.EventTypeNormal, "RuntimeDeployed"},
	{messagingv1alpha1.ConditionPruneScheduled, metav1.ConditionTrue, corev1.EventTypeNormal, "PruneScheduled"},
	{messagingv1alpha1.ConditionRetentionResolved, metav1.ConditionFalse, corev1.EventTypeWarning, "RetentionUnresolved"},
	{messagingv1alpha1.ConditionStalled, metav1.ConditionTrue, corev1.EventTypeWarning, "Stalled"},
	{messagingv1alpha1.ConditionBrokerLimits, metav1.ConditionFalse, corev1.EventTypeWarning, messagingv1alpha1.ReasonBrokerLimitTooSmall},
}

func (r *Reconciler) emitTransitions(before, after *messagingv1alpha1.IdempotentConsumer) {
	for _, t := range transitionEvents {
		now := meta.FindStatusCondition(after.Status.Conditions, t.condition)
		if now == nil || now.Status != t.status {
			continue
		}
		if was := meta.FindStatusCondition(before.Status.Conditions, t.condition); was != nil && was.Status == now.Status && was.Reason == now.Reason {
			continue
		}
		reason := t.reason
		if t.condition == messagingv1alpha1.ConditionStalled || (t.condition == messagingv1alpha1.ConditionEffectReady && t.status == metav1.ConditionFalse) {
			reason = now.Reason // Conflict, InvalidSpec, UnboundedReplay; TableNotFound, ColumnNotFound...
		}
		r.recorder.Eventf(after, nil, t.eventType, reason, t.condition, "%s", now.Message)
	}
}

func sourceSummary(idc *messagingv1alpha1.IdempotentConsumer) string {
	s := idc.Spec.Source
	switch {
	case s.NATSJetStream != nil:
		return fmt.Sprintf("NATSJetStream %s/%s", s.NATSJetStream.Stream, s.NATSJetStream.Consumer)
	case s.Kafka != nil:
		return fmt.Sprintf("Kafka %v/%s", s.Kafka.Topics, s.Kafka.ConsumerGroup)
	case s.RabbitMQ != nil:
		return "RabbitMQ " + s.RabbitMQ.Queue
	case s.RedisStreams != nil:
		return fmt.Sprintf("RedisStreams %s/%s", s.RedisStreams.Stream, s.RedisStreams.Group)
	}
	return ""
}

func guaranteeFor(idc *messagingv1alpha1.IdempotentConsumer) messagingv1alpha1.Guarantee {
	if idc.Spec.Sink.Effect.HTTP != nil {
		return messagingv1alpha1.GuaranteeAtLeastOnceWithIdempotencyKey
	}
	return messagingv1alpha1.GuaranteeExactlyOnceEffect
}

// jitter spreads periodic requeues of many resources over +-10%.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.2-0.1)*float64(d))
}

// SetupWithManager registers the controller, its watches and field indexes.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	ctx := context.Background()
	indexes := map[string]func(*messagingv1alpha1.IdempotentConsumer) []string{
		secretIndexKey:   secretNames,
		inboxIndexKey:    func(idc *messagingv1alpha1.IdempotentConsumer) []string { return []string{inboxIdentity(idc)} },
		consumerIndexKey: func(idc *messagingv1alpha1.IdempotentConsumer) []string { return []string{consumerIdentity(idc)} },
	}
	for key, fn := range indexes {
		if err := idx.IndexField(ctx, &messagingv1alpha1.IdempotentConsumer{}, key, func(o client.Object) []string {
			return fn(o.(*messagingv1alpha1.IdempotentConsumer))
		}); err != nil {
			return fmt.Errorf("indexing %s: %w", key, err)
		}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("idempotentconsumer").
		For(&messagingv1alpha1.IdempotentConsumer{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, redriveAnnotationChanged))).
		Owns(&appsv1.Deployment{}).
		Owns(&batchv1.CronJob{}).
		Owns(&batchv1.Job{}).
		Owns(&corev1.ConfigMap{}).
		// Only Secret metadata is cached: enough to map a change to its
		// consumers; the data is read on demand.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.consumersOfSecret), builder.OnlyMetadata).
		// A resource that goes away releases its inbox table and broker
		// consumer: the one that lost the conflict takes over at once.
		Watches(&messagingv1alpha1.IdempotentConsumer{}, handler.EnqueueRequestsFromMapFunc(r.rivalsOf), builder.WithPredicates(goingAway)).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.MaxConcurrent}).
		Complete(r)
}

// goingAway passes deletions and the update that marks a resource deleted.
var goingAway = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return true },
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetDeletionTimestamp().IsZero() && !e.ObjectNew.GetDeletionTimestamp().IsZero()
	},
}

// rivalsOf maps a resource to the others claiming its inbox table or its
// broker consumer.
func (r *Reconciler) rivalsOf(ctx context.Context, o client.Object) []reconcile.Request {
	idc, ok := o.(*messagingv1alpha1.IdempotentConsumer)
	if !ok {
		return nil
	}
	var out []reconcile.Request
	for index, value := range map[string]string{inboxIndexKey: inboxIdentity(idc), consumerIndexKey: consumerIdentity(idc)} {
		var list messagingv1alpha1.IdempotentConsumerList
		if err := r.client.List(ctx, &list, client.MatchingFields{index: value}); err != nil {
			log.FromContext(ctx).Error(err, "listing resources that conflict with a deleted one", "consumer", klog.KObj(o))
			continue
		}
		for _, other := range list.Items {
			if other.UID != idc.UID {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: other.Namespace, Name: other.Name}})
			}
		}
	}
	return out
}

// consumersOfSecret maps a Secret to the resources that reference it.
func (r *Reconciler) consumersOfSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var list messagingv1alpha1.IdempotentConsumerList
	if err := r.client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{secretIndexKey: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "listing consumers of a Secret", "secret", klog.KObj(o))
		return nil
	}
	out := make([]reconcile.Request, len(list.Items))
	for i, idc := range list.Items {
		out[i] = reconcile.Request{NamespacedName: types.NamespacedName{Namespace: idc.Namespace, Name: idc.Name}}
	}
	return out
}
