package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

const (
	// AnnotationRedrive: a new value (any token) makes the controller run
	// one redrive Job for it: the dead letters go through the claim and the
	// effect again, exactly once. One Job per token, never two at once.
	AnnotationRedrive = "messaging.idempotency.dev/redrive"
	// AnnotationRedriveReason optionally limits a redrive to one reason
	// class (missing_id, invalid_id, invalid_json, evaluation, database,
	// http, id_conflict).
	AnnotationRedriveReason = "messaging.idempotency.dev/redrive-reason"
	// AnnotationRedriveIDs optionally limits a redrive to the dead letters
	// of these message ids: a JSON array of strings, e.g. ["o-1","o-2"]
	// (`kubectl idc redrive --id` writes it).
	AnnotationRedriveIDs = "messaging.idempotency.dev/redrive-ids"
)

// RedrivePhase is where the redrive of one token is.
// +kubebuilder:validation:Enum=Running;Succeeded;Failed
type RedrivePhase string

const (
	RedriveRunning   RedrivePhase = "Running"
	RedriveSucceeded RedrivePhase = "Succeeded"
	RedriveFailed    RedrivePhase = "Failed"
)

// RedriveRunStatus is the latest redrive triggered through the annotation;
// the counts are read from <inbox>_redrives, where the Job records what it
// did with each dead letter.
type RedriveRunStatus struct {
	// token is the annotation value the redrive ran for.
	Token string `json:"token"`
	// phase is Running, Succeeded or Failed.
	// +optional
	Phase RedrivePhase `json:"phase,omitempty"`
	// job is the Job that runs it.
	// +optional
	Job string `json:"job,omitempty"`
	// message says why it failed (a bad reason annotation, a Job that
	// failed).
	// +optional
	Message string `json:"message,omitempty"`
	// time the Job finished.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
	// selected dead letters (settled or tried).
	// +optional
	Selected int32 `json:"selected,omitempty"`
	// applied: the effect was written.
	// +optional
	Applied int32 `json:"applied,omitempty"`
	// duplicates: the id was already in the inbox; the row was removed.
	// +optional
	Duplicates int32 `json:"duplicates,omitempty"`
	// stale: refused by the sequence gate; the row was removed.
	// +optional
	Stale int32 `json:"stale,omitempty"`
	// stillFailing: failed again; the row stays with one attempt more.
	// +optional
	StillFailing int32 `json:"stillFailing,omitempty"`
	// unusable: no usable message id; the row stays.
	// +optional
	Unusable int32 `json:"unusable,omitempty"`
	// requeued: dead-lettered outbox events (an emit the target refused, an
	// http call out of attempts) put back in the outbox for the relay to
	// publish again; the row was removed.
	// +optional
	Requeued int32 `json:"requeued,omitempty"`
}
