package controllers

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// outcome is what one phase observed, turned into a condition by the pure
// functions below. A zero outcome means the phase was not reached.
type outcome struct {
	reached bool
	ok      bool
	// unknown: the phase ran but could not tell (the condition is Unknown
	// with the reason, e.g. BrokerLimits while the broker is not read).
	unknown bool
	reason  string
	message string
}

func okOutcome(reason, message string) outcome {
	return outcome{reached: true, ok: true, reason: reason, message: message}
}

func failed(reason, message string) outcome {
	return outcome{reached: true, reason: reason, message: message}
}

func unknown(reason, message string) outcome {
	return outcome{reached: true, unknown: true, reason: reason, message: message}
}

// observation collects what a reconcile pass saw.
type observation struct {
	// stalled is set when a person must act (invalid spec, conflict,
	// unbounded replay, a sink only a person can fix: needsHuman).
	stalled   outcome
	secrets   outcome
	inbox     outcome
	effect    outcome
	retention outcome
	runtime   outcome
	prune     outcome
	// brokerLimits is the BrokerLimits condition; it never blocks Ready.
	brokerLimits outcome
	// autoscaling is the Autoscaling condition (only with
	// spec.runtime.autoscaling); it never blocks Ready.
	autoscaling outcome
	// warning is added to the Ready condition's message (a spec that
	// turns TLS certificate verification off).
	warning string
	// err is a failure of the pass itself (the API server): retried with
	// backoff. Sink and broker faults are not errors: they are re-checked.
	err error
}

// blocker is the first unmet precondition, used for conditions of phases
// that were not reached.
func (o *observation) blocker() outcome {
	for _, c := range []outcome{o.stalled, o.secrets} {
		if c.reached && !c.ok {
			return c
		}
	}
	return outcome{}
}

func setCondition(idc *messagingv1alpha1.IdempotentConsumer, typ string, o outcome, blocker outcome) {
	c := metav1.Condition{Type: typ, ObservedGeneration: idc.Generation}
	switch {
	case o.reached && o.unknown:
		c.Status, c.Reason, c.Message = metav1.ConditionUnknown, o.reason, o.message
	case o.reached:
		c.Status, c.Reason, c.Message = boolStatus(o.ok), o.reason, o.message
	case blocker.reached:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, blocker.reason, blocker.message
	default:
		c.Status, c.Reason, c.Message = metav1.ConditionUnknown, messagingv1alpha1.ReasonProgressing, "not evaluated yet"
	}
	meta.SetStatusCondition(&idc.Status.Conditions, c)
}

func boolStatus(b bool) metav1.ConditionStatus {
	if b {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

// setConditions computes every condition from an observation. Pure: tested
// without a cluster.
func setConditions(idc *messagingv1alpha1.IdempotentConsumer, o *observation) {
	b := o.blocker()
	setCondition(idc, messagingv1alpha1.ConditionInboxReady, o.inbox, b)
	setCondition(idc, messagingv1alpha1.ConditionEffectReady, o.effect, b)
	setCondition(idc, messagingv1alpha1.ConditionRetentionResolved, o.retention, b)
	setCondition(idc, messagingv1alpha1.ConditionRuntimeReady, o.runtime, b)
	setCondition(idc, messagingv1alpha1.ConditionPruneScheduled, o.prune, b)
	// Unknown, never False, until the broker was read: False means a limit
	// was seen too small (and emits a Warning event).
	setCondition(idc, messagingv1alpha1.ConditionBrokerLimits, o.brokerLimits, outcome{})
	if idc.Spec.Runtime.Autoscaling != nil {
		setCondition(idc, messagingv1alpha1.ConditionAutoscaling, o.autoscaling, b)
	} else {
		meta.RemoveStatusCondition(&idc.Status.Conditions, messagingv1alpha1.ConditionAutoscaling)
	}

	ready := summarize(o)
	if o.warning != "" {
		ready.message += "; " + o.warning
	}
	setCondition(idc, messagingv1alpha1.ConditionReady, ready, outcome{})

	stalled := o.stalled.reached && !o.stalled.ok
	if stalled {
		setCondition(idc, messagingv1alpha1.ConditionStalled, failedAsTrue(o.stalled), outcome{})
	} else {
		setCondition(idc, messagingv1alpha1.ConditionStalled, failed(messagingv1alpha1.ReasonReady, "no human action needed"), outcome{})
	}
	if ready.ok || stalled {
		setCondition(idc, messagingv1alpha1.ConditionReconciling, failed(messagingv1alpha1.ReasonReady, "converged"), outcome{})
	} else {
		setCondition(idc, messagingv1alpha1.ConditionReconciling, okOutcome(ready.reason, ready.message), outcome{})
	}
}

// failedAsTrue turns a failure outcome into a True condition (Stalled=True).
func failedAsTrue(o outcome) outcome {
	o.ok = true
	return o
}

// summarize is the Ready condition: the first phase that is not ok, in the
// order a person would fix them.
func summarize(o *observation) outcome {
	if b := o.blocker(); b.reached {
		return b
	}
	phases := []struct {
		name string
		o    outcome
	}{
		{"inbox", o.inbox}, {"effect", o.effect}, {"retention", o.retention}, {"runtime", o.runtime}, {"prune", o.prune},
	}
	for _, p := range phases {
		if !p.o.reached {
			return failed(messagingv1alpha1.ReasonProgressing, fmt.Sprintf("waiting for the %s phase", p.name))
		}
		// A prune the user suspended on purpose does not make the consumer unready.
		if !p.o.ok && p.o.reason != messagingv1alpha1.ReasonPruneSuspended {
			return failed(p.o.reason, p.o.message)
		}
	}
	// A held-back prune is what the on-call engineer must see first (in a
	// suspension too): ids are kept that the window alone would delete.
	if o.prune.reason == messagingv1alpha1.ReasonPruneHeldBack {
		return o.prune
	}
	if o.runtime.reason == messagingv1alpha1.ReasonSuspended {
		return okOutcome(messagingv1alpha1.ReasonSuspended, "the runtime is suspended (spec.suspend); pruning continues")
	}
	return okOutcome(messagingv1alpha1.ReasonReady, "inbox provisioned, runtime available, pruning scheduled")
}
