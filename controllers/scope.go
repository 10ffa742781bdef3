package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// scope is everything one reconcile pass of one resource knows: the
// resource as read and the copy its status is projected into, its rendered
// config and Secrets, what the broker reported, the window in force and
// what each phase observed. Phases read and add to it; nothing else is
// threaded between them.
type scope struct {
	// before is the resource as read; idc is the copy the phases write
	// status into.
	before, idc *messagingv1alpha1.IdempotentConsumer
	key         types.NamespacedName
	rc          *renderedConfig
	secrets     *resolvedSecrets
	// reading is the broker reading in force (fresh or reused), nil in
	// Explicit mode or before the broker phase.
	reading *brokerReading
	// window is the retention window in force; 0 while unresolved.
	window time.Duration
	obs    observation
	halted bool
	// kedaInstalled: KEDA's API is served (asked only for a resource that
	// autoscales).
	kedaInstalled bool
	// liveReplicas is the consumer Deployment's spec.replicas as read
	// back, whoever set it.
	liveReplicas int32
	// reused is the sink checks' snapshot this pass reuses (the sink memo);
	// recording is the one it takes instead. At most one is set.
	reused, recording *sinkSnapshot
	// claim is what the resource claims of its inbox (ownerClaim), set by
	// the inbox phase.
	claim inbox.OwnerClaim
}

func newScope(idc *messagingv1alpha1.IdempotentConsumer) *scope {
	return &scope{before: idc.DeepCopy(), idc: idc, key: client.ObjectKeyFromObject(idc)}
}

// target is the resource's sink database for the sinkdb client.
func (s *scope) target() sinkdb.Target {
	return sinkdb.Target{Owner: s.key.String(), DSN: s.secrets.getenv(envPostgresDSN), Sink: s.rc.Config.Sink, Outbox: s.rc.Config.UsesOutbox(), Claim: s.claim}
}

// halt ends the pass after the current phase: what it observed explains
// why, and the phases after it are not reached.
func (s *scope) halt() { s.halted = true }

// stall ends the pass with Stalled=True: a person must act.
func (s *scope) stall(reason, message string) {
	s.obs.stalled = failed(reason, message)
	s.halt()
}

// phase is one step of a pass. It may ask for an earlier requeue, halt the
// pass through the scope, or fail it with an error (retried with backoff).
type phase struct {
	name string
	run  func(context.Context, *scope) (ctrl.Result, error)
}

// phases are run in this order, the order a person would fix them in.
func (r *Reconciler) phases() []phase {
	return []phase{
		{"render", r.renderPhase},
		{"conflict", r.conflictPhase},
		{"secrets", r.secretsPhase},
		{"finalizer", r.finalizerPhase},
		{"inbox", r.inboxPhase},
		{"effect", r.effectPhase},
		{"broker", r.brokerPhase},
		{"retention", r.retentionPhase},
		{"children", r.childrenPhase},
		{"autoscaling", r.autoscalingPhase},
		{"workload", r.workloadPhase},
		{"last-prune", r.lastPrunePhase},
		{"outbox", r.outboxPhase},
		{"id-conflicts", r.idConflictsPhase},
		{"redrive", r.redrivePhase},
	}
}

// runPhases runs the phases until one halts the pass or fails, and returns
// the earliest requeue any asked for.
func (r *Reconciler) runPhases(ctx context.Context, s *scope) (ctrl.Result, error) {
	var res ctrl.Result
	for _, p := range r.phases() {
		start := time.Now()
		pr, err := p.run(ctx, s)
		phaseSeconds.WithLabelValues(p.name).Observe(time.Since(start).Seconds())
		if pr.RequeueAfter > 0 && (res.RequeueAfter == 0 || pr.RequeueAfter < res.RequeueAfter) {
			res.RequeueAfter = pr.RequeueAfter
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", p.name, err)
		}
		if s.halted {
			break
		}
	}
	return res, nil
}

// renderPhase renders the runtime config; a spec that does not render
// stalls with InvalidSpec naming the field.
func (r *Reconciler) renderPhase(_ context.Context, s *scope) (ctrl.Result, error) {
	s.idc.Status.Source = sourceSummary(s.idc)
	s.idc.Status.Guarantee = guaranteeFor(s.idc)
	rc, err := renderConfig(s.idc)
	if err == nil {
		err = validateSQLParams(rc.Config)
	}
	if err == nil {
		err = rc.withHTTPDenyNetworks(r.opts.HTTPDenyNetworks)
	}
	if err != nil {
		s.stall(messagingv1alpha1.ReasonInvalidSpec, err.Error())
		return ctrl.Result{}, nil
	}
	if msg := r.imageRefusal(s.idc); msg != "" {
		s.stall(messagingv1alpha1.ReasonImageNotAllowed, msg)
		return ctrl.Result{}, nil
	}
	r.warnInsecureTLS(s)
	s.rc = rc
	return ctrl.Result{}, nil
}

// conflictPhase stalls a resource that claims the inbox table or broker
// consumer an older resource owns.
func (r *Reconciler) conflictPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	conflict, err := r.findConflict(ctx, s.idc)
	if err != nil {
		return ctrl.Result{}, err
	}
	if conflict != "" {
		s.stall(messagingv1alpha1.ReasonConflict, conflict)
	}
	return ctrl.Result{}, nil
}

// secretsPhase reads every referenced Secret key. A missing one fails the
// pass: the Secret watch brings it back when it appears, the backoff in
// case the watch is not enough.
func (r *Reconciler) secretsPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	secrets, err := r.resolveSecrets(ctx, s.idc, s.rc)
	var se *secretError
	if errors.As(err, &se) {
		s.obs.secrets = failed(se.reason, se.message)
		return ctrl.Result{}, err
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	s.secrets = secrets
	s.obs.secrets = okOutcome(messagingv1alpha1.ReasonReady, "all referenced Secrets found")
	return ctrl.Result{}, nil
}

// finalizerPhase adds the drop-inbox finalizer for deletionPolicy Delete
// (and removes it for Retain) once the spec is known to render, before the
// first table is created: a resource that never rendered has nothing to
// drop and must never be held by the finalizer.
func (r *Reconciler) finalizerPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	want := s.idc.Spec.Sink.Inbox.DeletionPolicy == messagingv1alpha1.DeletionPolicyDelete
	if want == controllerutil.ContainsFinalizer(s.idc, FinalizerDropInbox) {
		return ctrl.Result{}, nil
	}
	patch := client.MergeFrom(s.idc.DeepCopy())
	if want {
		controllerutil.AddFinalizer(s.idc, FinalizerDropInbox)
	} else {
		controllerutil.RemoveFinalizer(s.idc, FinalizerDropInbox)
	}
	if err := r.client.Patch(ctx, s.idc, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("updating the finalizer: %w", err)
	}
	// The patch moved the resource's version; status is patched against it.
	s.before.Finalizers, s.before.ResourceVersion = s.idc.Finalizers, s.idc.ResourceVersion
	return ctrl.Result{}, nil
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

// scaleEvent says, as an event, that the consumer's replica count moved
// while it autoscales (KEDA's decision, seen on the Deployment).
func (r *Reconciler) scaleEvent(before, after *messagingv1alpha1.IdempotentConsumer) {
	if after.Spec.Runtime.Autoscaling == nil || before.Status.Runtime == nil || after.Status.Runtime == nil {
		return
	}
	was, now := before.Status.Runtime.DesiredReplicas, after.Status.Runtime.DesiredReplicas
	if was == nil || now == nil || *was == *now {
		return
	}
	reason := "ScaledUp"
	if *now < *was {
		reason = "ScaledDown"
	}
	r.recorder.Eventf(after, nil, corev1.EventTypeNormal, reason, "Scale", "replicas %d -> %d (%s)", *was, *now, after.Status.Runtime.ScaleReason)
}

func (r *Reconciler) emitTransitions(before, after *messagingv1alpha1.IdempotentConsumer) {
	r.scaleEvent(before, after)
	// A sink fault that stalls moves EffectReady and Stalled at once, with
	// the same reason and message: one event says it.
	emitted := map[string]bool{}
	// A resource's first status (no conditions yet) turns several
	// conditions True at once: one Normal event names them all, instead of
	// one event each (creating 1,000 resources posted 4,000 events).
	first := len(before.Status.Conditions) == 0
	var firstReason string
	var firstNotes []string
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
		if emitted[t.eventType+"/"+reason] {
			continue
		}
		emitted[t.eventType+"/"+reason] = true
		if first && t.eventType == corev1.EventTypeNormal {
			if firstReason == "" {
				firstReason = reason
			}
			firstNotes = append(firstNotes, t.condition+": "+now.Message)
			continue
		}
		r.recorder.Eventf(after, nil, t.eventType, reason, t.condition, "%s", now.Message)
	}
	if firstReason != "" {
		r.recorder.Eventf(after, nil, corev1.EventTypeNormal, firstReason, "Reconcile", "%s", truncateNote(strings.Join(firstNotes, "; ")))
	}
}

// maxNote is the events.k8s.io limit on an event's note, in bytes: a
// longer one is refused by the API server.
const maxNote = 1024

// truncateNote cuts a note to maxNote bytes on a rune boundary, with an
// ellipsis.
func truncateNote(note string) string {
	if len(note) <= maxNote {
		return note
	}
	cut := maxNote - len("…")
	for cut > 0 && !utf8.RuneStart(note[cut]) {
		cut--
	}
	return note[:cut] + "…"
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
