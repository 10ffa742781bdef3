package controllers

import (
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

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
