package podrunner

import (
	"context"
	"errors"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// jobRun is the local state of one Job: its single pod.
type jobRun struct {
	name             string
	cronJob          string // owning CronJob, if any
	pod              *pod
	started          metav1.Time
	deadlineExceeded bool
}

func (r *Runner) syncJobs(ctx context.Context) error {
	var list batchv1.JobList
	if err := r.c.List(ctx, &list, client.InNamespace(r.opts.Namespace)); err != nil {
		return fmt.Errorf("listing Jobs: %w", err)
	}
	seen := map[types.UID]bool{}
	for i := range list.Items {
		j := &list.Items[i]
		seen[j.UID] = true
		if err := r.syncJob(ctx, j); err != nil {
			r.opts.Log.Error(err, "syncing a Job", "job", j.Name)
		}
	}
	for uid, run := range r.jobs {
		if !seen[uid] {
			r.stopInBackground(run.pod)
			delete(r.jobs, uid)
		}
	}
	return nil
}

// JobFinished returns the Job's terminal condition type (Complete or
// Failed), "" while it is not finished.
func JobFinished(j *batchv1.Job) batchv1.JobConditionType {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return c.Type
		}
	}
	return ""
}

func (r *Runner) syncJob(ctx context.Context, j *batchv1.Job) error {
	run := r.jobs[j.UID]
	if JobFinished(j) != "" {
		if run != nil && !run.pod.terminal() {
			r.stopInBackground(run.pod)
		}
		return nil
	}
	if ptr.Deref(j.Spec.Suspend, false) {
		return nil
	}
	if run == nil {
		var err error
		if run, err = r.startJob(j); err != nil {
			return err
		}
	}
	now := metav1.Now()
	if d := j.Spec.ActiveDeadlineSeconds; d != nil && !run.deadlineExceeded && now.Sub(run.started.Time) > time.Duration(*d)*time.Second {
		r.opts.Log.Info("Job exceeded activeDeadlineSeconds, stopping it", "job", j.Name)
		run.deadlineExceeded = true
		r.stopInBackground(run.pod)
	}
	st := jobStatus(j, run.pod.snapshot(), run.started, run.deadlineExceeded, now)
	if equality.Semantic.DeepEqual(st, j.Status) {
		return nil
	}
	j.Status = st
	if err := r.c.Status().Update(ctx, j); err != nil {
		return fmt.Errorf("updating the status of Job %s: %w", j.Name, err)
	}
	if JobFinished(j) == batchv1.JobComplete && run.cronJob != "" {
		r.recordCronSuccess(ctx, run.cronJob, st.CompletionTime)
	}
	return nil
}

func (r *Runner) startJob(j *batchv1.Job) (*jobRun, error) {
	p, err := r.startPod(podTemplate{
		owner: "Job/" + j.Name, namePrefix: j.Name + "-", template: &j.Spec.Template,
		restartPolicy: j.Spec.Template.Spec.RestartPolicy, backoffLimit: int(ptr.Deref(j.Spec.BackoffLimit, 6)),
	})
	if err != nil {
		return nil, err
	}
	run := &jobRun{name: j.Name, pod: p, started: metav1.Now()}
	if ref := metav1.GetControllerOf(j); ref != nil && ref.Kind == "CronJob" {
		run.cronJob = ref.Name
	}
	r.jobs[j.UID] = run
	return run, nil
}

// jobStatus is the status the Job controller would write for its one pod.
// The terminal conditions come with the ones the API server requires
// (SuccessCriteriaMet before Complete, FailureTarget before Failed).
func jobStatus(j *batchv1.Job, p PodInfo, started metav1.Time, deadlineExceeded bool, now metav1.Time) batchv1.JobStatus {
	st := *j.Status.DeepCopy()
	if st.StartTime == nil {
		st.StartTime = &started
	}
	st.Failed = int32(p.Failures)
	switch {
	case p.Phase == PhaseSucceeded:
		st.Active, st.Ready, st.Succeeded = 0, ptr.To(int32(0)), 1
		st.CompletionTime = &now
		st.Conditions = append(st.Conditions,
			jobCondition(batchv1.JobSuccessCriteriaMet, "CompletionsReached", "Reached expected number of succeeded pods", now),
			jobCondition(batchv1.JobComplete, "CompletionsReached", "Reached expected number of succeeded pods", now))
	case deadlineExceeded || p.Phase == PhaseFailed:
		reason, msg := "BackoffLimitExceeded", "Job has reached the specified backoff limit"
		if deadlineExceeded {
			reason, msg = "DeadlineExceeded", "Job was active longer than specified deadline"
			st.Failed++
		}
		st.Active, st.Ready = 0, ptr.To(int32(0))
		st.Conditions = append(st.Conditions,
			jobCondition(batchv1.JobFailureTarget, reason, msg, now),
			jobCondition(batchv1.JobFailed, reason, msg, now))
	default:
		st.Active = 1
		st.Ready = ptr.To(int32(0))
		if p.Ready && p.Phase == PhaseRunning {
			st.Ready = ptr.To(int32(1))
		}
	}
	return st
}

func jobCondition(t batchv1.JobConditionType, reason, msg string, now metav1.Time) batchv1.JobCondition {
	return batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: msg, LastProbeTime: now, LastTransitionTime: now}
}

// WaitForJob polls the API until the Job has finished and returns it; an
// error when it failed or ctx ended first.
func (r *Runner) WaitForJob(ctx context.Context, name string) (*batchv1.Job, error) {
	for {
		j := &batchv1.Job{}
		err := r.c.Get(ctx, client.ObjectKey{Namespace: r.opts.Namespace, Name: name}, j)
		if err == nil {
			switch JobFinished(j) {
			case batchv1.JobComplete:
				return j, nil
			case batchv1.JobFailed:
				return j, fmt.Errorf("job %s failed (%d failures); see the logs of its pod", name, j.Status.Failed)
			}
		}
		select {
		case <-ctx.Done():
			return j, errors.Join(fmt.Errorf("waiting for job %s: %w", name, ctx.Err()), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
