package podrunner

import (
	"context"
	"fmt"
	"time"

	"github.com/robfig/cron/v3"
	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// cronState is the next scheduled run of one CronJob.
type cronState struct {
	schedule string
	next     time.Time
}

// TriggerCronJob creates a Job from the CronJob's jobTemplate now, as
// `kubectl create job --from=cronjob/NAME` does (suspend is ignored, like
// there), and returns the Job's name. The runner then runs it.
func (r *Runner) TriggerCronJob(ctx context.Context, name string) (string, error) {
	cj := &batchv1.CronJob{}
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: r.opts.Namespace, Name: name}, cj); err != nil {
		return "", fmt.Errorf("reading CronJob %s: %w", name, err)
	}
	job := jobFromCronJob(cj, name+"-"+rand.String(5), "manual")
	if err := r.c.Create(ctx, job); err != nil {
		return "", fmt.Errorf("creating a Job from CronJob %s: %w", name, err)
	}
	r.opts.Log.Info("created a Job from a CronJob", "cronjob", name, "job", job.Name)
	r.poke()
	return job.Name, nil
}

// jobFromCronJob renders the Job the CronJob controller would create.
func jobFromCronJob(cj *batchv1.CronJob, name, instantiate string) *batchv1.Job {
	tmpl := cj.Spec.JobTemplate.DeepCopy()
	annotations := map[string]string{"cronjob.kubernetes.io/instantiate": instantiate}
	for k, v := range tmpl.Annotations {
		annotations[k] = v
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: cj.Namespace, Labels: tmpl.Labels, Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cj, batchv1.SchemeGroupVersion.WithKind("CronJob"))},
		},
		Spec: tmpl.Spec,
	}
}

// syncSchedules creates the Jobs whose scheduled time has come. Missed runs
// are not caught up: the next run is computed from now.
func (r *Runner) syncSchedules(ctx context.Context, now time.Time) error {
	var list batchv1.CronJobList
	if err := r.c.List(ctx, &list, client.InNamespace(r.opts.Namespace)); err != nil {
		return fmt.Errorf("listing CronJobs: %w", err)
	}
	for i := range list.Items {
		cj := &list.Items[i]
		if err := r.syncSchedule(ctx, cj, now); err != nil {
			r.opts.Log.Error(err, "running a CronJob's schedule", "cronjob", cj.Name)
		}
	}
	return nil
}

func (r *Runner) syncSchedule(ctx context.Context, cj *batchv1.CronJob, now time.Time) error {
	sched, err := cron.ParseStandard(cj.Spec.Schedule)
	if err != nil {
		return fmt.Errorf("parsing schedule %q: %w", cj.Spec.Schedule, err)
	}
	st := r.crons[cj.Name]
	if st == nil || st.schedule != cj.Spec.Schedule {
		st = &cronState{schedule: cj.Spec.Schedule, next: sched.Next(now)}
		r.crons[cj.Name] = st
	}
	if now.Before(st.next) {
		return nil
	}
	scheduled := st.next
	st.next = sched.Next(now)
	if ptr.Deref(cj.Spec.Suspend, false) {
		return nil
	}
	if cj.Spec.ConcurrencyPolicy == batchv1.ForbidConcurrent && r.cronJobActive(cj.Name) {
		r.opts.Log.Info("skipping a scheduled run: the previous Job is still active (concurrencyPolicy Forbid)", "cronjob", cj.Name)
		return nil
	}
	job := jobFromCronJob(cj, fmt.Sprintf("%s-%d", cj.Name, scheduled.Unix()/60), "scheduled")
	if err := r.c.Create(ctx, job); err != nil {
		return fmt.Errorf("creating the scheduled Job: %w", err)
	}
	cj.Status.LastScheduleTime = &metav1.Time{Time: scheduled}
	if err := r.c.Status().Update(ctx, cj); err != nil {
		return fmt.Errorf("recording lastScheduleTime: %w", err)
	}
	r.poke()
	return nil
}

func (r *Runner) cronJobActive(name string) bool {
	for _, j := range r.jobs {
		if j.cronJob == name && !j.pod.terminal() && !j.deadlineExceeded {
			return true
		}
	}
	return false
}

// recordCronSuccess sets the CronJob's lastSuccessfulTime; best effort.
func (r *Runner) recordCronSuccess(ctx context.Context, name string, at *metav1.Time) {
	cj := &batchv1.CronJob{}
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: r.opts.Namespace, Name: name}, cj); err != nil {
		return
	}
	cj.Status.LastSuccessfulTime = at
	if err := r.c.Status().Update(ctx, cj); err != nil {
		r.opts.Log.Error(err, "recording lastSuccessfulTime", "cronjob", name)
	}
}
