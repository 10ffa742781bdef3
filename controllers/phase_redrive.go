package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create;delete

const (
	eventRedriveStarted  = "RedriveStarted"
	eventRedriveFinished = "RedriveFinished"
	eventRedriveFailed   = "RedriveFailed"
)

// redriveReasonClasses are the values the reason annotation accepts (the
// dead-letter reason classes).
var redriveReasonClasses = inbox.DeadLetterClasses

// redriveFilter reads the reason and ids annotations; refused says why
// they cannot be used (then nothing is redriven).
func redriveFilter(idc *messagingv1alpha1.IdempotentConsumer) (reason string, ids []string, refused string) {
	reason = idc.Annotations[messagingv1alpha1.AnnotationRedriveReason]
	if reason != "" && !slices.Contains(redriveReasonClasses, reason) {
		return "", nil, fmt.Sprintf("annotation %s: %q is not a reason class (one of %v); nothing was redriven",
			messagingv1alpha1.AnnotationRedriveReason, reason, redriveReasonClasses)
	}
	ids, err := redriveIDs(idc.Annotations[messagingv1alpha1.AnnotationRedriveIDs])
	if err != nil {
		return "", nil, fmt.Sprintf("annotation %s: %v; nothing was redriven", messagingv1alpha1.AnnotationRedriveIDs, err)
	}
	return reason, ids, ""
}

// maxRedriveIDs bounds the ids annotation: each becomes an argument of the
// Job's container.
const maxRedriveIDs = 1000

// redriveIDs reads the ids annotation: empty, or a JSON array of non-empty
// message ids.
func redriveIDs(v string) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	var ids []string
	if err := json.Unmarshal([]byte(v), &ids); err != nil {
		return nil, fmt.Errorf("must be a JSON array of message ids, e.g. [\"o-1\",\"o-2\"]: %w", err)
	}
	if len(ids) > maxRedriveIDs {
		return nil, fmt.Errorf("lists %d ids, at most %d", len(ids), maxRedriveIDs)
	}
	for i, id := range ids {
		if id == "" {
			return nil, fmt.Errorf("id %d is empty", i)
		}
	}
	return ids, nil
}

// jobFinished says whether the Job ended and whether it succeeded.
func jobFinished(j *batchv1.Job) (finished, succeeded bool) {
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			return true, true
		case batchv1.JobFailed:
			return true, false
		}
	}
	return false, false
}

// redriveStatusFromSummary fills the counts of st from the recorded run.
func redriveStatusFromSummary(st *messagingv1alpha1.RedriveRunStatus, sum inbox.RedriveSummary) {
	n := func(outcome string) int32 { return int32(sum.Outcomes[outcome]) }
	st.Selected = int32(sum.Total())
	st.Applied, st.Duplicates, st.Stale = n("applied"), n("duplicate"), n("stale")
	st.StillFailing, st.Unusable, st.Requeued = n("still_failing"), n("unusable"), n("requeued")
}

// reconcileRedrive runs the redrive the annotation asks for: one Job per
// token, never two at once for one resource. status.lastRedrive remembers
// the token from the moment its Job is created, so a Job deleted after it
// finished is never run again.
func (r *Reconciler) redrivePhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	return ctrl.Result{}, r.reconcileRedrive(ctx, s, runtimeImageFor(s.idc, r.opts.RuntimeImage))
}

func (r *Reconciler) reconcileRedrive(ctx context.Context, s *scope, image string) error {
	idc, rc, secrets := s.idc, s.rc, s.secrets
	var list batchv1.JobList
	if err := r.client.List(ctx, &list, client.InNamespace(idc.Namespace), client.MatchingLabels{
		"app.kubernetes.io/instance": idc.Name, "app.kubernetes.io/component": specs.ComponentRedrive,
	}); err != nil {
		return fmt.Errorf("listing redrive Jobs: %w", err)
	}
	jobs := map[string]*batchv1.Job{}
	var active *batchv1.Job
	for i := range list.Items {
		j := &list.Items[i]
		if !metav1.IsControlledBy(j, idc) {
			continue
		}
		jobs[j.Name] = j
		if done, _ := jobFinished(j); !done {
			active = j
		}
	}
	token := idc.Annotations[messagingv1alpha1.AnnotationRedrive]
	// The Jobs are the truth, status a record of them that a pass on a
	// stale cache may lag behind: adopt the Job that runs, else the Job of
	// the token asked for, before finishing or starting anything.
	adopt := active
	if adopt == nil && token != "" {
		adopt = jobs[specs.RedriveJobName(idc, token)]
	}
	if adopt != nil {
		if t := adopt.Annotations[messagingv1alpha1.AnnotationRedrive]; idc.Status.LastRedrive == nil || idc.Status.LastRedrive.Token != t {
			idc.Status.LastRedrive = &messagingv1alpha1.RedriveRunStatus{Token: t, Phase: messagingv1alpha1.RedriveRunning, Job: adopt.Name}
		}
	}
	if err := r.finishRedrive(ctx, s, jobs); err != nil {
		return err
	}
	if token == "" || (idc.Status.LastRedrive != nil && idc.Status.LastRedrive.Token == token) || active != nil {
		// Nothing new, or a Job still runs: its end brings us back.
		return nil
	}
	reason, ids, refused := redriveFilter(idc)
	if refused != "" {
		idc.Status.LastRedrive = &messagingv1alpha1.RedriveRunStatus{Token: token, Phase: messagingv1alpha1.RedriveFailed, Message: refused}
		r.recorder.Eventf(idc, nil, corev1.EventTypeWarning, eventRedriveFailed, "Redrive", "%s", refused)
		return nil
	}
	job := specs.RedriveJob(idc, &rc.RuntimeConfig, image, secrets.hash, token, reason, ids)
	if err := controllerutil.SetControllerReference(idc, job, r.scheme); err != nil {
		return fmt.Errorf("owning redrive Job %s: %w", job.Name, err)
	}
	switch err := r.client.Create(ctx, job); {
	case apierrors.IsAlreadyExists(err):
		// Created by a pass whose Job the cache has not shown yet.
	case apierrors.IsInvalid(err):
		// Refused for good (the same pod spec as the Deployment's, which
		// stalls the pass first, so seldom): the redrive fails, no retry.
		msg := invalidChild("Job", job.Name, err).Error()
		idc.Status.LastRedrive = &messagingv1alpha1.RedriveRunStatus{Token: token, Phase: messagingv1alpha1.RedriveFailed, Message: msg}
		r.recorder.Eventf(idc, nil, corev1.EventTypeWarning, eventRedriveFailed, "Redrive", "%s", msg)
		return nil
	case err != nil:
		return fmt.Errorf("creating redrive Job %s: %w", job.Name, err)
	default:
		r.recorder.Eventf(idc, job, corev1.EventTypeNormal, eventRedriveStarted, "Redrive",
			"redrive %q started as Job %s (reason filter %q)", token, job.Name, reason)
	}
	idc.Status.LastRedrive = &messagingv1alpha1.RedriveRunStatus{Token: token, Phase: messagingv1alpha1.RedriveRunning, Job: job.Name}
	return nil
}

// finishRedrive fills status.lastRedrive once its Job ended: the counts
// from <inbox>_redrives and an event.
func (r *Reconciler) finishRedrive(ctx context.Context, s *scope, jobs map[string]*batchv1.Job) error {
	idc := s.idc
	st := idc.Status.LastRedrive
	if st == nil || st.Phase != messagingv1alpha1.RedriveRunning {
		return nil
	}
	j, ok := jobs[st.Job]
	if !ok {
		next := st.DeepCopy()
		next.Phase, next.Message = messagingv1alpha1.RedriveFailed, fmt.Sprintf("Job %s is gone before it finished", st.Job)
		idc.Status.LastRedrive = next
		r.recorder.Eventf(idc, nil, corev1.EventTypeWarning, eventRedriveFailed, "Redrive", "redrive %q: %s", st.Token, next.Message)
		return nil
	}
	done, succeeded := jobFinished(j)
	if !done {
		return nil
	}
	next := st.DeepCopy()
	sum, err := r.opts.Sink.RedriveSummary(ctx, s.target(), st.Token)
	if err != nil {
		_, msg := classifyDBError(idc, err)
		return fmt.Errorf("reading redrive %q: %s", st.Token, msg)
	}
	redriveStatusFromSummary(next, sum)
	finished := metav1.NewTime(r.opts.Clock.Now().UTC())
	if t := j.Status.CompletionTime; t != nil {
		finished = *t
	}
	next.Time = &finished
	if succeeded {
		next.Phase = messagingv1alpha1.RedriveSucceeded
		r.recorder.Eventf(idc, j, corev1.EventTypeNormal, eventRedriveFinished, "Redrive",
			"redrive %q: %d selected, %d applied, %d duplicates, %d stale, %d still failing, %d without a usable id, %d outbox events requeued",
			st.Token, next.Selected, next.Applied, next.Duplicates, next.Stale, next.StillFailing, next.Unusable, next.Requeued)
	} else {
		next.Phase, next.Message = messagingv1alpha1.RedriveFailed, fmt.Sprintf("Job %s failed; see its pods' logs", j.Name)
		r.recorder.Eventf(idc, j, corev1.EventTypeWarning, eventRedriveFailed, "Redrive",
			"redrive %q: Job %s failed after %d applied; see its pods' logs", st.Token, j.Name, next.Applied)
	}
	idc.Status.LastRedrive = next
	return nil
}
